"""What one rollout of a held-out evaluation is: the stage it belongs to and how its episode
ended. Apart from domain/evaluation.py (the statistics, with numpy) so the router, which keeps
each report's episode in its phase, stays light."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from domain.protocol import RolloutResponse

# The rollout metrics an episode's figures come from (reward_envs/worker/rollout.py).
TURNS_METRIC, INVALID_METRIC = "turns", "env/invalid"
# A rollout's model turns cut at the token limit (finish_reason "length"): the worker reports it.
TRUNCATED_METRIC = "truncated_turns"


class EvaluationStage(StrEnum):
    BASELINE = "baseline"  # the starting model, before training
    FINAL = "final"  # the model training ended with


# A run's phases: the baseline evaluation, training, the final evaluation. One is open at a
# time; what a phase that ended still sends is refused (lambdas/router/).
TRAINING = "training"


def phase_of(stage: EvaluationStage | None) -> str:
    """The phase an evaluation stage is (None: training)."""
    return stage.value if stage else TRAINING


def stage_of(phase: str) -> EvaluationStage | None:
    """The evaluation stage a phase is (None: training); `phase_of` the other way."""
    return None if phase == TRAINING else EvaluationStage(phase)


class Episode(BaseModel):
    """How one evaluation rollout ended."""

    model_config = ConfigDict(frozen=True)

    record_id: str
    sample_id: str
    stop_reason: str
    score: float | None = None
    success: bool | None = None
    turns: float = 0.0
    invalid_moves: float | None = None
    truncated_turns: float | None = None
    error: str | None = None

    @classmethod
    def of(cls, record_id: str, response: RolloutResponse) -> Episode:
        metrics = {metric.name: metric.value for metric in response.metrics}
        return cls(
            record_id=record_id,
            sample_id=response.sample_id,
            stop_reason=response.stop_reason,
            score=response.aggregate_score,
            success=response.succeeded,
            turns=metrics.get(TURNS_METRIC, 0.0),
            invalid_moves=metrics.get(INVALID_METRIC),
            truncated_turns=metrics.get(TRUNCATED_METRIC),
            error=response.error,
        )

    @classmethod
    def unanswered(cls, record_id: str, sample_id: str, waited_seconds: float) -> Episode:
        return cls(
            record_id=record_id,
            sample_id=sample_id,
            stop_reason="no_response",
            error=f"no rollout response within {waited_seconds:.0f} s",
        )

    @property
    def passed(self) -> bool:
        return bool(self.success)
