"""The local trainer's policy: small, CPU-only, and honest about it.

It is not a language model. It is a linear softmax policy over a fixed set of candidate replies,
each described by a few features computed from the conversation so far; its parameters are one
weight per feature. It answers the same generate requests a model server answers (a reply and
its log-probability), so the pipeline, router, workers and GRPO update around it are the real
ones. What it can learn is limited to weighing its features — enough to go from random guessing
to winning Wordle most of the time, which is what a local run needs to show.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from reward_envs.interface import Environment, Message, Reply
from reward_envs.support_desk.notes import Notes, call, read_notes
from reward_envs.wordle import words
from reward_envs.wordle.env import read_feedback
from reward_envs.wordle.solver import encode, pattern_matrix


@dataclass(frozen=True)
class Decision:
    """One reply (text, or an assistant message with tool calls): the candidates' features, the
    one chosen, and its log-probability then."""

    reply: str | Message
    features: np.ndarray  # (candidates, features), float32
    choice: int
    logprob: float

    @property
    def message(self) -> Message:
        """The reply as the assistant message a model server answers with."""
        return Reply.of(self.reply).message

    @property
    def text(self) -> str:
        """The reply as one token's text (the local policy samples a reply as one token)."""
        return self.reply if isinstance(self.reply, str) else json.dumps(self.reply, sort_keys=True)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max()
    return shifted - np.log(np.exp(shifted).sum())


class Policy(ABC):
    """Linear softmax over candidates: P(c) ∝ exp(features(c) · params)."""

    feature_names: tuple[str, ...]

    @abstractmethod
    def features(self, messages: Sequence[Message]) -> np.ndarray:
        """Each candidate's features after `messages`, shape (candidates, len(feature_names))."""

    @abstractmethod
    def reply(self, choice: int, messages: Sequence[Message]) -> str | Message:
        """Candidate `choice` after `messages`: its text, or its assistant message."""

    def initial_params(self) -> np.ndarray:
        """All zeros: every candidate equally likely (a policy that knows nothing)."""
        return np.zeros(len(self.feature_names))

    def decide(
        self, params: np.ndarray, messages: Sequence[Message], rng: np.random.Generator
    ) -> Decision:
        features = self.features(messages)
        logprobs = log_softmax(features @ params)
        choice = int(rng.choice(len(logprobs), p=np.exp(logprobs)))
        return Decision(self.reply(choice, messages), features, choice, float(logprobs[choice]))


class WordlePolicy(Policy):
    """Candidates: the Wordle answer list. Features, from the feedback shown so far:

    - consistent: 1 if the word agrees with every feedback line, else 0;
    - violations: the share of feedback lines it disagrees with;
    - coverage: how common its distinct letters are among the still-consistent words (0-1);
    - fresh_letters: the share of its distinct letters not tried yet;
    - repeated: 1 if it was already guessed (an invalid move).
    """

    feature_names = ("consistent", "violations", "coverage", "fresh_letters", "repeated")

    def __init__(self, answers: Sequence[str] | None = None) -> None:
        self.words = tuple(answers or words.answers())
        self._index = {word: i for i, word in enumerate(self.words)}
        self._patterns = pattern_matrix(self.words, self.words)
        letters = np.frombuffer("".join(self.words).encode(), dtype=np.uint8).reshape(-1, 5) - 97
        self._has = np.zeros((len(self.words), 26), dtype=np.float32)
        np.put_along_axis(self._has, letters.astype(np.int64), 1.0, axis=1)
        self._distinct = self._has.sum(axis=1)

    def reply(self, choice: int, messages: Sequence[Message]) -> str:
        return f"[{self.words[choice]}]"

    def features(self, messages: Sequence[Message]) -> np.ndarray:
        history = read_feedback(messages)
        n = len(self.words)
        mismatches = np.zeros(n, dtype=np.float32)
        tried = np.zeros(26, dtype=np.float32)
        repeated = np.zeros(n, dtype=np.float32)
        for guess, marks in history:
            row = self._row(guess)
            mismatches += row != encode(marks)
            for letter in guess:
                tried[ord(letter) - 97] = 1.0
            if guess in self._index:
                repeated[self._index[guess]] = 1.0
        consistent = (mismatches == 0).astype(np.float32)
        alive = consistent.astype(bool) if consistent.any() else np.ones(n, dtype=bool)
        frequency = self._has[alive].mean(axis=0)
        coverage = self._has @ frequency / np.maximum(self._distinct, 1)
        fresh = self._has @ (1.0 - tried) / np.maximum(self._distinct, 1)
        violations = mismatches / max(1, len(history))
        return np.stack([consistent, violations, coverage, fresh, repeated], axis=1).astype(
            np.float32
        )

    def _row(self, guess: str) -> np.ndarray:
        if guess in self._index:
            return self._patterns[self._index[guess]]
        return pattern_matrix([guess], self.words)[0]


class SupportDeskPolicy(Policy):
    """Candidates: the support desk's actions, filled in from what the conversation has shown
    (reward_envs/support_desk/notes.py) — look up the order, the customer, the tier's policy;
    refund the order in full; finish refunded or denied; or answer in words. Features:

    - gathers: it looks up something the decision needs and is not known yet;
    - repeats: it looks up what is already known (a wasted call);
    - premature: it refunds or finishes before everything is known;
    - by_policy: it is what the known facts call for (refund when allowed and not done yet,
      finish as the facts say once the refund is done or not allowed);
    - against_policy: a refund or a finish the known facts contradict;
    - retries: it refunds again after the refund service failed transiently;
    - words: it calls no tool.
    """

    feature_names = (
        "gathers", "repeats", "premature", "by_policy", "against_policy", "retries", "words",
    )  # fmt: skip
    ACTIONS = (
        "get_order", "get_customer", "get_refund_policy", "issue_refund", "finish_refunded",
        "finish_denied", "words",
    )  # fmt: skip

    def features(self, messages: Sequence[Message]) -> np.ndarray:
        notes = read_notes(messages)
        allowed = notes.refund_allowed()
        rows = []
        for action in self.ACTIONS:
            known = self._known(notes, action)
            deciding = action in ("issue_refund", "finish_refunded", "finish_denied")
            wanted = {
                "issue_refund": allowed is True and not notes.refund_issued,
                "finish_refunded": allowed is True and notes.refund_issued,
                "finish_denied": allowed is False,
            }.get(action, False)
            contradicted = deciding and allowed is not None and not wanted
            rows.append([
                known is False,
                known is True,
                deciding and allowed is None,
                wanted,
                contradicted,
                action == "issue_refund" and notes.last_refund_transient and allowed is True,
                action == "words",
            ])  # fmt: skip
        return np.asarray(rows, dtype=np.float32)

    @staticmethod
    def _known(notes: Notes, action: str) -> bool | None:
        """Whether what a look-up action fetches is known already (None: not a look-up)."""
        return {
            "get_order": notes.order is not None,
            "get_customer": notes.customer is not None,
            "get_refund_policy": notes.policy is not None,
        }.get(action)

    def reply(self, choice: int, messages: Sequence[Message]) -> str | Message:
        notes, action = read_notes(messages), self.ACTIONS[choice]
        turn = f"call_{len(messages)}"
        order, customer = notes.order or {}, notes.customer or {}
        match action:
            case "get_order":
                return call(turn, action, order_id=notes.order_id or "")
            case "get_customer":
                return call(turn, action, customer_id=notes.customer_id or "")
            case "get_refund_policy":
                return call(turn, action, tier=customer.get("tier", "standard"))
            case "issue_refund":
                amount = order.get("amount_cents", 1)
                return call(turn, action, order_id=notes.order_id or "", amount_cents=amount)
            case "finish_refunded" | "finish_denied":
                decision = action.removeprefix("finish_")
                return call(
                    turn, "finish", decision=decision, message=f"Your request is {decision}."
                )
        return "Let me look into this for you."


POLICIES: dict[str, Callable[[], Policy]] = {
    "wordle": WordlePolicy,
    "support_desk": SupportDeskPolicy,
}


class NoLocalPolicy(LookupError):
    """The environment has no local policy to train."""


def policy_for(environment: Environment) -> Policy:
    """The local policy of an environment, by its name: a variant of Wordle named "wordle" (a
    subclass, say) plays with Wordle's policy."""
    if environment.name not in POLICIES:
        raise NoLocalPolicy(
            f"environment {environment.name!r} has no local policy (the local trainer has one "
            f"for {', '.join(sorted(POLICIES))}); train it with a small language model on this "
            "machine: `pip install -e '.[llm]'`, then `mtrl local FILE --trainer llm --model "
            "tiny`; or evaluate it against a served model with `mtrl local FILE "
            "--model-endpoint URL`"
        )
    return POLICIES[environment.name]()
