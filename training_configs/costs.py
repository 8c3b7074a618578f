"""The cost model: instance prices as data, the burn per hour of a config, a run's estimate.

Numbers are planning estimates: `instance_prices.json` holds approximate on-demand prices;
pass your own prices where they differ. The run estimate is an upper bound (the whole deadline
at full burn), which is what the pipeline compares with the budget before it starts a run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from training_configs.schema import TrainingConfig

HOURS_PER_MONTH = 730


@dataclass(frozen=True)
class InstancePrices:
    hyperpod_instance_per_hour: dict[str, float]
    fargate_vcpu_per_hour: float
    fargate_gb_per_hour: float
    platform_idle_per_hour: float
    # By per-unit storage throughput (MB/s per TiB).
    fsx_lustre_per_gb_month: dict[int, float]

    @classmethod
    def load(cls, path: str | Path | None = None) -> InstancePrices:
        if path is None:
            text = resources.files("training_configs").joinpath("instance_prices.json").read_text()
        else:
            text = Path(path).read_text()
        data: dict[str, Any] = json.loads(text)
        return cls(
            hyperpod_instance_per_hour={
                k: float(v) for k, v in data["hyperpod_instance_per_hour"].items()
            },
            fargate_vcpu_per_hour=float(data["fargate_vcpu_per_hour"]),
            fargate_gb_per_hour=float(data["fargate_gb_per_hour"]),
            platform_idle_per_hour=float(data["platform_idle_per_hour"]),
            fsx_lustre_per_gb_month={
                int(k): float(v)
                for k, v in data["fsx_lustre_per_gb_month"].items()
                if not k.startswith("_")
            },
        )

    def fsx_lustre_per_hour(self, *, size_gib: int, throughput: int) -> float:
        """An FSx for Lustre file system's cost an hour (a month of 730 hours, as AWS bills)."""
        try:
            per_gb_month = self.fsx_lustre_per_gb_month[throughput]
        except KeyError:
            known = ", ".join(map(str, sorted(self.fsx_lustre_per_gb_month)))
            raise KeyError(
                f"no FSx for Lustre price at {throughput} MB/s/TiB; known: {known}; add it to "
                "your prices file"
            ) from None
        return size_gib * per_gb_month / HOURS_PER_MONTH

    def instance(self, instance_type: str) -> float:
        try:
            return self.hyperpod_instance_per_hour[instance_type]
        except KeyError:
            known = ", ".join(sorted(self.hyperpod_instance_per_hour))
            raise KeyError(
                f"no price for {instance_type}; known: {known}; add it to your prices file"
            ) from None


@dataclass(frozen=True)
class CostEstimate:
    gpu_per_hour: float
    reward_workers_per_hour: float
    platform_per_hour: float
    deadline_hours: float
    budget_usd: float
    # A serverless run: SageMaker's managed job bills per token, at a price not in this model.
    token_charge_excluded: bool = False

    @property
    def per_hour(self) -> float:
        return self.gpu_per_hour + self.reward_workers_per_hour + self.platform_per_hour

    @property
    def run_at_most(self) -> float:
        return self.per_hour * self.deadline_hours

    @property
    def within_budget(self) -> bool:
        return self.run_at_most <= self.budget_usd

    def describe(self) -> str:
        verdict = "within" if self.within_budget else "OVER"
        return (
            f"${self.per_hour:,.2f}/hour (GPUs ${self.gpu_per_hour:,.2f}, reward workers "
            f"${self.reward_workers_per_hour:,.2f}, platform ${self.platform_per_hour:,.2f}); at most "
            f"${self.run_at_most:,.0f} over the {self.deadline_hours:g} h deadline, {verdict} the "
            f"${self.budget_usd:,.0f} budget"
            + ("; without the managed job's per-token charge" if self.token_charge_excluded else "")
        )


def estimate(
    config: TrainingConfig,
    prices: InstancePrices | None = None,
    *,
    worker_vcpus: float = 1.0,
    worker_memory_gb: float = 2.0,
) -> CostEstimate:
    prices = prices or InstancePrices.load()
    serverless = config.plane == "serverless"
    gpu = (
        0.0 if serverless else config.instance_count * prices.instance(config.instance_type)  # type: ignore[operator,arg-type]
    )
    worker = (
        worker_vcpus * prices.fargate_vcpu_per_hour + worker_memory_gb * prices.fargate_gb_per_hour
    )
    return CostEstimate(
        gpu_per_hour=gpu,
        # At most: the fleet may scale out to reward_workers_max on backlog.
        reward_workers_per_hour=(config.reward_workers_max or config.reward_workers) * worker,
        platform_per_hour=prices.platform_idle_per_hour,
        deadline_hours=config.deadline_hours,
        budget_usd=config.budget_usd,
        token_charge_excluded=serverless,
    )
