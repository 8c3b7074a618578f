"""Token-exact trajectories: what generation produced, kept as tokens, and turned into training
sequences without re-tokenizing anything.

Each model turn is kept as generation saw and wrote it: the prompt's token ids (the conversation
rendered by the chat template, as it was fed to the model) and the sampled token ids with their
log-probabilities. A conversation's turns become training sequences (`Segment`s): a turn whose
prompt begins with every token of the sequence so far extends it (the tokens between are the
environment's, masked); otherwise — a chat template that rewrites earlier turns (dropping
`<think>` blocks, say), or a reply whose text encodes to other tokens than were sampled — the
turn starts a sequence of its own. Either way every token is one the model saw or sampled, and
the loss covers only the sampled ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SampledTurn:
    """One model turn of a conversation: `turn` orders a sample's turns."""

    turn: int
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]  # the behaviour policy's, one per completion token
    finish_reason: str  # "stop" (end of turn sampled) or "length" (cut at max_new_tokens)
    policy_version: int

    def __post_init__(self) -> None:
        if len(self.completion_ids) != len(self.logprobs):
            raise ValueError(
                f"turn {self.turn}: {len(self.completion_ids)} sampled tokens but "
                f"{len(self.logprobs)} log-probabilities"
            )


@dataclass
class Segment:
    """One training sequence: `sampled[i]` says whether token i was sampled by the model (the loss
    covers it, against `behaviour_logprobs[i]`) or given to it (system, user, tool, template)."""

    token_ids: list[int] = field(default_factory=list)
    sampled: list[bool] = field(default_factory=list)
    behaviour_logprobs: list[float] = field(default_factory=list)

    def extend(self, ids: Sequence[int], *, logprobs: Sequence[float] | None = None) -> None:
        self.token_ids += ids
        self.sampled += [logprobs is not None] * len(ids)
        self.behaviour_logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)

    @property
    def sampled_count(self) -> int:
        return sum(self.sampled)


def segments(turns: Sequence[SampledTurn]) -> list[Segment]:
    """A conversation's turns (in any order) as training sequences, merged where exact."""
    built: list[Segment] = []
    for turn in sorted(turns, key=lambda t: t.turn):
        current = built[-1] if built else None
        prompt = list(turn.prompt_ids)
        if current is not None and prompt[: len(current.token_ids)] == current.token_ids:
            current.extend(prompt[len(current.token_ids) :])
        else:
            current = Segment()
            current.extend(prompt)
            built.append(current)
        current.extend(turn.completion_ids, logprobs=turn.logprobs)
    return built


def stale_samples(
    turns: Mapping[str, Sequence[SampledTurn]], *, version: int, bound: int
) -> set[str]:
    """The samples with a turn sampled by weights more than `bound` updates older than
    `version`, the weights about to be updated (`grpo.max_off_policy_steps`)."""
    return {
        sample
        for sample, sampled in turns.items()
        if any(turn.policy_version < version - bound for turn in sampled)
    }


def merged_turns(
    kept: Sequence[Mapping[str, Sequence[SampledTurn]]],
) -> dict[str, list[SampledTurn]]:
    """What several generating processes kept, per sample in turn order (a conversation's turns
    may have been answered by different processes)."""
    merged: dict[str, list[SampledTurn]] = {}
    for each in kept:
        for sample, turns in each.items():
            merged.setdefault(sample, []).extend(turns)
    return {sample: sorted(turns, key=lambda turn: turn.turn) for sample, turns in merged.items()}
