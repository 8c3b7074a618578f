"""The training configuration: one typed model, YAML files, clear errors.

`load_training_config("rft_multiturn_lora")` reads a shipped file by name; a path reads the
user's own. Every problem is reported as `config FILE: key: what is wrong`.
"""

from __future__ import annotations

import difflib
import hashlib
import typing
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Self

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    field_validator,
    model_validator,
)

Recipe = Literal["RFT_MULTITURN_LORA", "RFT_MULTITURN_FULL"]
SHIPPED = ("rft_multiturn_lora", "rft_multiturn_full")
DEFAULT_CONFIG = "rft_multiturn_lora"  # what a run uses when its upload names none
# The longest a run may take (a month); the pipeline's state machine outlives any valid run.
MAX_DEADLINE_HOURS = 720.0
# Where a config's `eval_dataset` lives in the data bucket (domain/bucket.py's layout): apart from
# training-data/, where an upload starts a run.
EVALUATION_DATA_PREFIX = "evaluation-data/"
DEFAULT_EVAL_FRACTION = 0.1


class TrainingConfigError(ValueError):
    """An invalid training config; the message names the file, the key and the fix."""


class LoraSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int = Field(default=32, ge=1, le=512, description="the adapter's rank r")
    alpha: int = Field(
        default=64, ge=1, le=1024, description="the adapter's scale: its update is alpha / r times"
    )
    # No trainer here takes a dropout: Nova's and the managed job's recipes have no such key, and
    # the open-weights trainer samples and updates without one (a dropout in the update alone
    # makes the on-policy importance ratio differ from 1). Kept so a config may say 0.
    dropout: float = Field(default=0.0, description="0: no trainer here takes a LoRA dropout")

    @field_validator("dropout")
    @classmethod
    def _no_dropout(cls, dropout: float) -> float:
        if dropout:
            raise ValueError(
                f"{dropout}: no trainer here takes a LoRA dropout (Nova's and the managed job's "
                "recipes have none; the open-weights trainer samples without one, and an update "
                "with it would not be on-policy); remove it"
            )
        return dropout


class LocalPolicySettings(BaseModel):
    """The local trainer's optimizer: its policy is a small linear model, not the LLM, and
    learns with a far larger step than `learning_rate` (which is the LLM's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    learning_rate: float = Field(
        default=0.4, gt=0.0, le=10.0, description="the small policy's step (not the LLM's)"
    )
    epochs: int = Field(default=1, ge=1, le=10, description="updates per batch of rollouts")
    checkpoint_every: int = Field(default=10, ge=1, description="steps between checkpoints")


# How a group's rewards become advantages (domain/grpo.py): "std" divides by the group's spread
# (GRPO), "mean" only subtracts its mean (Dr. GRPO).
AdvantageNormalization = Literal["std", "mean"]


class GrpoSettings(BaseModel):
    """The open-weights trainer's sampling and update (llm_trainer/); Nova's recipes and the
    local policy have their own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float = Field(default=1.0, gt=0.0, le=2.0, description="sampling temperature")
    top_p: float = Field(
        default=1.0,
        gt=0.0,
        le=1.0,
        description="nucleus sampling; the update's log-probabilities are of the same truncated "
        "distribution",
    )
    top_k: int = Field(
        default=0, ge=0, le=1_000_000,
        description="sample from the k most probable tokens only (0: no cut); the update's "
        "log-probabilities are of the same cut distribution",
    )  # fmt: skip
    advantages: AdvantageNormalization = Field(
        default="std",
        description="each reward against its group's: std (less the mean, over the spread: "
        "GRPO) or mean (less the mean only: Dr. GRPO)",
    )
    loss_aggregation: Literal["token", "sequence", "dr_grpo"] = Field(
        default="token",
        description="how tokens' objectives add up: token (the mean over the step's sampled "
        "tokens: DAPO, TRL's default), sequence (the mean over episodes of each one's token "
        "mean: GRPO's paper; short episodes weigh more per token), dr_grpo (the sum over tokens "
        "over episodes × max_turns × max_new_tokens: Dr. GRPO)",
    )
    clip_ratio_high: float | None = Field(
        default=None, gt=0.0, le=10.0,
        description="the clip's upper ε (DAPO's clip-higher, e.g. 0.28); none: clip_ratio",
    )  # fmt: skip
    dual_clip: float | None = Field(
        default=3.0, gt=1.0, le=100.0,
        description="for a negative advantage, the ratio beyond which a token's objective "
        "stops falling (dual-clip PPO, verl's clip_ratio_c); none: unbounded",
    )  # fmt: skip
    log_ratio_limit: float = Field(
        default=20.0, gt=0.0, le=50.0,
        description="the importance log-ratio is clamped to ± this before exp (verl's ±20)",
    )  # fmt: skip
    token_ratio_band: tuple[float, float] | None = Field(
        default=(0.125, 8.0),
        description="[low, high]: a sampled token whose importance ratio (trainer over sampler) "
        "lies outside leaves the objective (masked importance sampling); none: every token counts",
    )
    sequence_ratio_band: tuple[float, float] | None = Field(
        default=(0.1, 10.0),
        description="[low, high]: a sequence whose geometric-mean importance ratio lies outside "
        "leaves the objective whole; none: every sequence counts",
    )
    truncated_rollouts: Literal["train", "mask", "penalise"] = Field(
        default="train",
        description="a rollout with a model turn cut at max_new_tokens: train (as any other, "
        "its reward says what the cut cost: TRL's default), mask (scored with its group, left "
        "out of the objective: DAPO's overlong filtering) or penalise (its advantage computed "
        "from its group's lowest reward: no cut answer beats a finished one; the reported "
        "rewards stay its own)",
    )
    skip_zero_variance_groups: bool = Field(
        default=True,
        description="leave groups whose rollouts all scored the same out of the update (their "
        "advantages are zero: only the KL term would train on them); counted in the metrics",
    )
    refill_rounds: int = Field(
        default=0, ge=0, le=10,
        description="dynamic sampling (DAPO): up to this many times a step, groups without a "
        "learning signal (all scored the same, or fewer than two scored) are replaced by as many "
        "new ones, played by the same weights; counted in the metrics (0: none)",
    )  # fmt: skip
    warmup_steps: int = Field(
        default=0,
        ge=0,
        description="steps over which the learning rate rises linearly to its value",
    )
    learning_rate_schedule: Literal["constant", "cosine"] = Field(
        default="constant",
        description="after warm-up: constant, or cosine decay to zero at max_steps",
    )
    logprob_chunk_tokens: int | None = Field(
        default=1024, ge=1, le=1_048_576,
        description="tokens whose vocabulary-wide scores the update holds at once (memory); "
        "none: the model's whole logits",
    )  # fmt: skip
    gradient_checkpointing: bool = Field(
        default=False,
        description="recompute each layer's activations in the backward pass instead of keeping "
        "them (less memory, about a third more compute)",
    )
    micro_batch_size: int = Field(
        default=4,
        ge=1,
        le=1024,
        description="sequences per forward and backward pass; the "
        "step's gradient is accumulated over them",
    )
    epochs: int = Field(default=1, ge=1, le=10, description="updates per batch of rollouts")
    checkpoint_every: int = Field(default=10, ge=1, description="steps between checkpoints")
    keep_checkpoints: int | None = Field(
        default=3,
        ge=1,
        description="step checkpoints kept, the newest (the final one is always kept); none: all",
    )
    max_grad_norm: float = Field(default=1.0, gt=0.0, description="gradient clipping")
    generation_batch_size: int = Field(
        default=16, ge=1, le=1024, description="generate requests answered together"
    )
    generation: Literal["auto", "transformers", "vllm"] = Field(
        default="auto",
        description="what samples the policy's turns: transformers (the model being trained "
        "itself), vllm (an engine beside it, LoRA runs: the adapter handed over each step), or "
        "auto: vllm for a LoRA run on a GPU where vLLM is installed (the trainer image), "
        "transformers otherwise",
    )
    vllm_memory_share: float = Field(
        default=0.3, gt=0.0, lt=1.0,
        description="with vllm: the share of the GPU's memory its engine takes (weights and "
        "cache); training keeps the rest",
    )  # fmt: skip
    max_off_policy_steps: int = Field(
        default=0,
        ge=0,
        le=8,
        description="steps whose rollouts are played while an earlier step trains (0: each "
        "step's after the update before it); a rollout with a turn from weights older than "
        "this many updates is dropped and counted",
    )

    @field_validator("token_ratio_band", "sequence_ratio_band")
    @classmethod
    def _around_one(cls, band: tuple[float, float] | None) -> tuple[float, float] | None:
        if band is not None and not 0.0 < band[0] < 1.0 < band[1]:
            raise ValueError(f"{list(band)}: a band [low, high] needs 0 < low < 1 < high")
        return band


class NovaRecipeSettings(BaseModel):
    """Knobs of Nova's BYOO recipe that a run may set, each named as the recipe leaf it sets
    (the Nova 2 user guide's "BYOO recipe configuration", nova-hp-rft-forge; ranges where AWS's
    recipes or launcher state them). Unset: the recipe keeps its own value."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reasoning_effort: Literal["low", "high"] | None = Field(
        default=None, description="training_config.reasoning_effort: low or high"
    )
    age_tolerance: int | None = Field(
        default=None, ge=0,
        description="rollout.rollout_strategy.age_tolerance: how many policy updates old a "
        "rollout may be (off_policy_async)",
    )  # fmt: skip
    temperature: float | None = Field(
        default=None, ge=0.0, le=2.0, description="rollout.generator.temperature"
    )
    top_k: int | None = Field(
        default=None, ge=-1, description="rollout.generator.top_k (0 or -1: no top-k cut)"
    )
    max_model_len: int | None = Field(
        default=None, ge=2, le=262_144,  # Nova 2 Lite's context: amazon.nova-2-lite-v1:0:256k
        description="rollout.generator.max_model_len (the recipe's default: max_seq_length)",
    )  # fmt: skip
    save_steps: int | None = Field(
        default=None, ge=1, description="train.save_steps: steps between checkpoints"
    )
    save_top_k: int | None = Field(
        default=None, ge=1, description="train.save_top_k: checkpoints kept"
    )
    ent_coeff: float | None = Field(
        default=None, ge=0.0, description="train.ent_coeff: the entropy bonus"
    )
    weight_decay: float | None = Field(
        default=None, ge=0.0, le=1.0, description="train.optim.weight_decay (0.0 to 1.0)"
    )
    warmup_steps: int | None = Field(default=None, ge=0, description="train.optim.warmup_steps")
    min_lr: float | None = Field(default=None, gt=0.0, le=1e-2, description="train.optim.min_lr")
    rollout_worker_replicas: int = Field(
        default=1, ge=1,
        description="run.rollout_worker_replicas: the chart's hub pods (1 in the documented "
        "recipe); always set, as the job's nodes are counted with it",
    )  # fmt: skip

    def chosen(self) -> dict[str, JsonValue]:
        """The knobs set, by recipe leaf."""
        return self.model_dump(exclude_none=True)


# Where a run trains: HyperPod (Nova on the restricted group, other models on the standard one) or
# SageMaker's managed multi-turn RL job ("serverless": no cluster, no instances to choose).
Plane = Literal["hyperpod", "serverless"]
LossFunction = Literal["importance_sampling", "ppo", "cispo"]
AdvantageMethod = Literal[
    "monte_carlo", "group_based", "group_based_per_turn", "rloo", "reinforce_pp",
    "reinforce_pp_baseline", "opo", "grpo_passk", "gpg",
]  # fmt: skip


class ServerlessSettings(BaseModel):
    """Knobs of SageMaker's managed multi-turn RL job that a run may set, each named as the
    hyperparameter it sets (AWS's MTRL recipe template parameters: training_configs/
    mtrl_recipe_template_parameters.json, whose ranges domain/serverless_job.py checks).
    Unset: the service keeps its own value."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    loss_fn: LossFunction | None = Field(default=None, description="rl.loss_fn")
    advantage_method: AdvantageMethod | None = Field(
        default=None, description="rl.advantage_method (group_based: GRPO's)"
    )
    temperature: float | None = Field(default=None, description="sampling_params.temperature")
    sampling_top_p: float | None = Field(default=None, description="sampling_params.top_p")
    max_steps_off_policy: int | None = Field(
        default=None, description="async_config.max_steps_off_policy: how stale a rollout may be"
    )
    rollout_max_retries: int | None = Field(default=None, description="rollout.max_retries")
    save_every: int | None = Field(default=None, description="schedule.save_every (steps)")
    val_every: int | None = Field(default=None, description="schedule.val_every (steps)")
    lora_plus_lr_ratio: float | None = Field(
        default=None, description="model.lora_plus_lr_ratio (Nova only)"
    )
    adam_weight_decay: float | None = Field(default=None, description="model.weight_decay")
    adam_grad_clip_norm: float | None = Field(default=None, description="model.grad_clip_norm")

    def chosen(self) -> dict[str, JsonValue]:
        """The knobs set, by hyperparameter name."""
        return self.model_dump(exclude_none=True)


HealthMetric = Literal[
    "zero_variance_groups",
    "failed_rollout_rate",
    "env_error_rate",
    "timeout_rate",
    "truncation_rate",
    "reward_hacking",
    "mean_reward",
    "reward_spread",
    "mean_turns",
    "sampler_mismatch",
]
# The metrics that are shares of a step's groups or rollouts, in [0, 1].
SHARES = frozenset(
    {"zero_variance_groups", "failed_rollout_rate", "env_error_rate", "timeout_rate",
     "truncation_rate"}
)  # fmt: skip


class HealthRule(BaseModel):
    """A run-health rule (domain/health.py): when `metric` of a training step is at least
    `at_least` (or at most `at_most`) for `steps` steps in a row, `warn` or `stop` the run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    metric: HealthMetric = Field(description="the step figure the rule watches")
    at_least: float | None = Field(
        default=None,
        description="a share of the step's groups or rollouts; reward_hacking: a rise in reward; "
        "mean_reward, reward_spread: rewards; mean_turns: turns",
    )
    at_most: float | None = Field(default=None, description="as at_least, from below")
    steps: int = Field(ge=1, le=10_000, description="consecutive training steps")
    action: Literal["warn", "stop"] = Field(
        description="warn (a notification, once) or stop (the run fails, torn down)"
    )

    @model_validator(mode="after")
    def _one_bound(self) -> Self:
        bounds = [b for b in (self.at_least, self.at_most) if b is not None]
        if len(bounds) != 1:
            raise ValueError(f"health rule on {self.metric}: give one of at_least or at_most")
        (bound,) = bounds
        field = "at_least" if self.at_least is not None else "at_most"
        if self.metric in SHARES and not 0.0 <= bound <= 1.0:
            raise ValueError(
                f"health rule on {self.metric}: {field} {bound:g} is not a share (0 to 1)"
            )
        if self.metric == "mean_turns" and bound < 0:
            raise ValueError(
                f"health rule on mean_turns: {field} {bound:g}: turns are not negative"
            )
        return self

    def holds(self, value: float) -> bool:
        return value >= self.at_least if self.at_least is not None else value <= self.at_most  # type: ignore[operator]

    @property
    def bound(self) -> str:
        return f">= {self.at_least:g}" if self.at_least is not None else f"<= {self.at_most:g}"


# What stops the obviously dead run by default: no group with a learning signal for 10 steps,
# half the rollouts failing for 3; what warns: environment errors on a tenth of them, a quarter
# of them cut at max tokens, the reward rising by 0.1 over 10 steps with no more successes.
DEFAULT_HEALTH = (
    HealthRule(metric="zero_variance_groups", at_least=1.0, steps=10, action="stop"),
    HealthRule(metric="failed_rollout_rate", at_least=0.5, steps=3, action="stop"),
    HealthRule(metric="env_error_rate", at_least=0.1, steps=3, action="warn"),
    HealthRule(metric="truncation_rate", at_least=0.25, steps=3, action="warn"),
    HealthRule(metric="reward_hacking", at_least=0.1, steps=3, action="warn"),
    # The open-weights trainer's sampler/trainer KL per token; bfloat16 engines on the same
    # weights differ by about 1e-3 (prime-rl and verl report such figures); ten times that is a
    # sampler that is not the policy being trained (weights not handed over, another template).
    HealthRule(metric="sampler_mismatch", at_least=0.01, steps=3, action="warn"),
)


class TrainingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(
        min_length=1,
        max_length=64,
        pattern=r"^[a-z0-9][a-z0-9-]*$",
        description="the config's name",
    )
    recipe: Recipe = Field(description="LoRA (an adapter) or full (every weight)")
    model: str = Field(min_length=1, description="the base model the recipe trains")
    plane: Plane = Field(
        default="hyperpod",
        description="where it trains: hyperpod (the deployment's cluster) or serverless "
        "(SageMaker's managed multi-turn RL job, no instances)",
    )
    # HyperPod runs only (required there; a serverless run has no instances to choose).
    instance_type: str | None = Field(
        default=None,
        pattern=r"^ml\.[a-z0-9-]+\.[a-z0-9]+$",
        description="the GPU instance type (HyperPod)",
    )
    instance_count: int | None = Field(
        default=None, ge=1, le=64, description="nodes the run holds (HyperPod)"
    )
    generation_replicas: Literal[2, 4, 6, 8] | None = Field(
        default=None, description="vLLM replicas, a node each (Nova)"
    )
    group_size: int = Field(ge=2, le=64, description="GRPO rollouts per sample")
    global_batch_size: int = Field(ge=2, le=8192, description="rollouts per training step")
    max_steps: int = Field(ge=1, le=100_000, description="training steps")
    learning_rate: float = Field(gt=0.0, le=1e-2, description="the model's (AdamW) learning rate")
    kl_coefficient: float = Field(
        default=0.0, ge=0.0, le=10.0, description="the KL term's weight (0: no reference model)"
    )
    clip_ratio: float = Field(
        default=0.2, gt=0.0, lt=1.0, description="PPO's ε: the importance ratio's clip"
    )
    max_new_tokens: int = Field(ge=1, le=65_536, description="tokens per model turn at most")
    max_length: int = Field(
        ge=2, le=131_072, description="tokens of a whole conversation at most (prompt included)"
    )
    max_turns: int = Field(ge=1, le=100, description="model turns per episode at most")
    rollout_timeout_seconds: int = Field(
        ge=10, le=7200, description="an episode's time at most; past it, a timeout (no reward)"
    )
    rollout_concurrency: int = Field(ge=1, le=512, description="episodes per reward worker")
    reward_workers: int = Field(ge=1, le=500, description="reward workers (Fargate tasks) at start")
    reward_workers_max: int | None = Field(
        default=None,
        ge=1,
        le=500,
        description="scale the reward fleet out to this many workers on backlog (default: no scaling)",
    )
    environment: str = Field(
        default="wordle",
        min_length=1,
        description="the reward environment: a shipped name or a module:attribute of yours",
    )
    health: list[HealthRule] = Field(
        default_factory=lambda: list(DEFAULT_HEALTH),
        description="run-health rules over each step's metrics (empty: none)",
    )
    trajectories: bool = Field(
        default=True,
        description="keep every finished rollout (conversation, rewards) as Parquet under "
        "runs/<run_id>/trajectories/",
    )
    environment_args: dict[str, JsonValue] = Field(
        default={},
        description="the environment's load_environment arguments (e.g. openenv's url)",
    )
    deadline_hours: float = Field(
        gt=0.0, le=MAX_DEADLINE_HOURS, description="the run is stopped and torn down past it"
    )
    budget_usd: float = Field(
        gt=0.0,
        description="refused when its deadline's worth would pass it; stopped when spent",
    )
    scale_to_zero: bool = Field(
        default=True, description="scale the GPU group back to zero when the run ends"
    )
    lora: LoraSettings | None = Field(
        default=None, description="the adapter (RFT_MULTITURN_LORA; none for a full fine-tune)"
    )
    local_policy: LocalPolicySettings = Field(
        default=LocalPolicySettings(), description="`mtrl local`'s small policy"
    )
    grpo: GrpoSettings = Field(
        default=GrpoSettings(), description="the open-weights trainer's sampling and update"
    )
    nova: NovaRecipeSettings = Field(
        default=NovaRecipeSettings(),
        description="Nova's recipe knobs (Nova runs only); unset ones keep the recipe's value",
    )
    serverless: ServerlessSettings = Field(
        default=ServerlessSettings(),
        description="the managed job's knobs (serverless runs only); unset ones keep the "
        "service's value",
    )
    # Held-out evaluation of the starting and the trained model (domain/evaluation.py).
    eval_fraction: float | None = Field(
        default=None,
        ge=0.0,
        lt=1.0,
        description=f"share of the dataset's records held out for evaluation, never trained on "
        f"(default {DEFAULT_EVAL_FRACTION} unless eval_dataset names the records)",
    )
    eval_dataset: str | None = Field(
        default=None,
        pattern=rf"^{EVALUATION_DATA_PREFIX}[^\s]+\.jsonl$",
        description=f"a .jsonl under {EVALUATION_DATA_PREFIX} in the data bucket to evaluate on "
        "instead of a held-out fraction",
    )
    eval_samples: int = Field(
        default=4, ge=1, le=64, description="rollouts per evaluation record: the k of pass@k"
    )
    eval_max_records: int = Field(
        default=64, ge=1, le=10_000, description="evaluation records at most (the first held out)"
    )
    eval_seed: int = Field(default=0, ge=0, description="which records the fraction holds out")
    # Iterative training (domain/checkpoints.py): a previous run of the same model, or an S3 URI.
    base_checkpoint: str | None = Field(
        default=None,
        pattern=r"^(run:[a-z0-9][a-z0-9-]{0,79}|s3://[a-z0-9][a-z0-9.-]{1,62}/\S+)$",
        description="start from this checkpoint: run:<run_id> (that run's last) or s3://bucket/key",
    )

    @property
    def held_out_fraction(self) -> float:
        """The share of the training dataset held out: none when an evaluation file is named."""
        if self.eval_dataset:
            return 0.0
        return DEFAULT_EVAL_FRACTION if self.eval_fraction is None else self.eval_fraction

    @property
    def evaluates(self) -> bool:
        return self.eval_dataset is not None or self.held_out_fraction > 0

    @property
    def fingerprint(self) -> str:
        """12 hex digits of the config as it is (every field, defaults included): runs trained
        with the same settings share it in their trajectories and experiment tracking."""
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:12]

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        self._fits_plane()
        if self.eval_dataset and self.eval_fraction is not None:
            raise ValueError(
                "eval_dataset names the evaluation records; remove eval_fraction (or eval_dataset "
                "to hold out a share of the training data instead)"
            )
        if self.global_batch_size % self.group_size:
            raise ValueError(
                f"global_batch_size ({self.global_batch_size}) must be a multiple of group_size "
                f"({self.group_size}): every sample gets a whole group"
            )
        if self.max_length <= self.max_new_tokens:
            raise ValueError(
                "max_length must be larger than max_new_tokens (it includes the prompt)"
            )
        nova = self.nova
        for key in ("save_steps", "warmup_steps"):
            steps = getattr(nova, key)
            if steps is not None and steps > self.max_steps:
                raise ValueError(
                    f"nova.{key} ({steps}) is more than max_steps ({self.max_steps}); lower it"
                )
        if nova.max_model_len is not None and nova.max_model_len <= self.max_new_tokens:
            raise ValueError(
                f"nova.max_model_len ({nova.max_model_len}) must be larger than max_new_tokens "
                f"({self.max_new_tokens}): a reply has to fit the generator's context"
            )
        if self.grpo.warmup_steps > self.max_steps:
            raise ValueError(
                f"grpo.warmup_steps ({self.grpo.warmup_steps}) is more than max_steps "
                f"({self.max_steps}); lower it"
            )
        if self.reward_workers_max is not None and self.reward_workers_max < self.reward_workers:
            raise ValueError(
                f"reward_workers_max ({self.reward_workers_max}) must be at least reward_workers "
                f"({self.reward_workers})"
            )
        if self.recipe == "RFT_MULTITURN_LORA" and self.lora is None:
            raise ValueError(
                "recipe RFT_MULTITURN_LORA needs a lora: {rank, alpha, dropout} section"
            )
        if self.recipe == "RFT_MULTITURN_FULL" and self.lora is not None:
            raise ValueError(
                "recipe RFT_MULTITURN_FULL trains every weight: remove the lora section"
            )
        if self.grpo.generation == "vllm" and self.lora is None:
            raise ValueError(
                "grpo.generation vllm serves a LoRA run's adapter; full fine-tuning generates "
                "with transformers (set generation: transformers or use RFT_MULTITURN_LORA)"
            )
        return self

    def _fits_plane(self) -> None:
        instances = {key: getattr(self, key) for key in INSTANCE_KEYS}
        if self.plane == "hyperpod":
            if missing := [key for key, value in instances.items() if value is None]:
                raise ValueError(
                    f"{', '.join(missing)}: a hyperpod run needs them (its nodes; or set plane: "
                    "serverless for SageMaker's managed job, which has none)"
                )
            if self.serverless.chosen():
                raise ValueError("serverless: its knobs are for plane: serverless; remove them")
            return
        if chosen := [key for key, value in instances.items() if value is not None]:
            raise ValueError(
                f"{', '.join(chosen)}: a serverless run has no instances to choose; remove them "
                "(or set plane: hyperpod)"
            )


# What a HyperPod run chooses of its nodes, and a serverless one leaves to SageMaker.
INSTANCE_KEYS = ("instance_type", "instance_count", "generation_replicas")


def load_training_config(name_or_path: str | Path) -> TrainingConfig:
    """A shipped config by name (`rft_multiturn_lora`, `rft_multiturn_full`) or a YAML file."""
    if str(name_or_path) in SHIPPED:
        source = f"{name_or_path}.yaml"
        text = resources.files("training_configs").joinpath(source).read_text(encoding="utf-8")
    else:
        path = Path(name_or_path)
        source = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise TrainingConfigError(
                f"config {source}: no such file; use a path or one of {', '.join(SHIPPED)}"
            ) from None
        except (OSError, UnicodeDecodeError) as error:
            raise TrainingConfigError(f"config {source}: cannot read ({error})") from None
    return parse_training_config(text, source)


# How many values a config may hold once its YAML aliases are expanded: each alias repeats its
# anchor's whole value, so a few nested ones make billions ("billion laughs") for the validator
# to walk. A config holds a few hundred.
MAX_VALUES = 100_000
# How deeply a config's values may nest (a config nests four or five levels).
MAX_DEPTH = 100


class YamlTooLarge(yaml.YAMLError):
    """A document past one of load_yaml's bounds; the text says where, which and the fix."""

    def __init__(self, line: int, problem: str) -> None:
        super().__init__(f"line {line}: {problem}")


class TooManyValues(YamlTooLarge):
    def __init__(self, line: int) -> None:
        super().__init__(
            line,
            f"its YAML aliases (*name) expand to more than {MAX_VALUES} values: reuse fewer values",
        )


class TooDeep(YamlTooLarge):
    def __init__(self, line: int) -> None:
        super().__init__(line, f"nested more than {MAX_DEPTH} levels deep: nest less deeply")


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a document nested past MAX_DEPTH (its composer recurses
    once per level, and Python's stack ends near a thousand) or whose aliases expand it past
    MAX_VALUES values (counted on the composed node graph, each shared node once, before
    anything is built)."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise TooDeep(self.peek_event().start_mark.line + 1)
            return super().compose_node(parent, index)  # type: ignore[misc]
        finally:
            self._depth -= 1

    def get_single_node(self) -> Any:
        node = super().get_single_node()
        sizes: dict[int, int] = {}
        past: list[int] = []  # the line of the first node past the bound, its children within

        def size(of: yaml.Node) -> int:
            if id(of) in sizes:
                return sizes[id(of)]
            sizes[id(of)] = MAX_VALUES + 1  # a node inside itself never ends
            children = (
                [part for pair in of.value for part in pair]
                if isinstance(of, yaml.MappingNode)
                else of.value
                if isinstance(of, yaml.SequenceNode)
                else []
            )
            each = [size(child) for child in children]
            sizes[id(of)] = min(1 + sum(each), MAX_VALUES + 1)
            if sizes[id(of)] > MAX_VALUES and not past:
                past.append(of.start_mark.line + 1)
            return sizes[id(of)]

        if node is not None and size(node) > MAX_VALUES:
            raise TooManyValues(past[0])
        return node


def load_yaml(text: str) -> Any:
    """`text` as plain data (YAML's safe subset): at most MAX_DEPTH levels deep, at most
    MAX_VALUES values once expanded (YamlTooLarge)."""
    return yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 - a SafeLoader subclass


def yaml_problem(error: yaml.YAMLError) -> str:
    """What load_yaml refused, and where: a bound passed, or the line YAML stopped at."""
    if isinstance(error, YamlTooLarge):
        return str(error)
    mark = getattr(error, "problem_mark", None)
    return "not valid YAML" + (f" at line {mark.line + 1}" if mark else "")


def parse_training_config(text: str, source: str = "<config>") -> TrainingConfig:
    try:
        data = load_yaml(text)
    except yaml.YAMLError as error:
        raise TrainingConfigError(f"config {source}: {yaml_problem(error)}") from None
    if not isinstance(data, dict):
        raise TrainingConfigError(f"config {source}: expected a mapping of keys to values")
    try:
        return TrainingConfig.model_validate(data)
    except ValidationError as error:
        problems = [_problem(problem) for problem in error.errors(include_url=False)]
        raise TrainingConfigError(f"config {source}: {'; '.join(problems)}") from None


def _problem(problem: Any) -> str:
    """One validation problem as `key: what is wrong`; an unknown key with the known key closest
    to it, at its level, when one is close."""
    loc = tuple(problem["loc"])
    key = ".".join(str(part) for part in loc) or "config"
    if problem["type"] != "extra_forbidden":
        return f"{key}: {problem['msg'].removeprefix('Value error, ')}"
    closest = difflib.get_close_matches(str(loc[-1]), _keys_at(TrainingConfig, loc[:-1]), n=1)
    hint = f"did you mean {closest[0]}?" if closest else "check its spelling"
    return f"{key}: unknown key ({hint})"


def _keys_at(model: type[BaseModel], path: tuple[Any, ...]) -> list[str]:
    """The keys a config takes under `path` (field names of the nested model there; none where
    the path leaves the models)."""
    for part in path:
        if isinstance(part, int):  # an item of a list of models
            continue
        field = model.model_fields.get(str(part))
        nested = field and _model_in(field.annotation)
        if nested is None:
            return []
        model = nested
    return list(model.model_fields)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model an annotation holds (itself, or inside Optional / a union)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in typing.get_args(annotation):
        found = _model_in(argument)
        if found is not None:
            return found
    return None
