"""The rollout protocol, version v0: the messages between trainer, router and reward workers.

Shapes follow what AWS documents for Nova multi-turn RFT "delegate" rollouts (DESIGN.md
section 4), so a Nova trainer and our local trainer speak the same protocol. This module is
the one home of these messages: every producer and consumer imports them from here.
`parse` turns raw text into a message or raises `ProtocolError` saying exactly what is wrong;
consumers count those and never crash on them.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from typing import Any, Literal
from urllib.parse import quote, unquote

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from domain.chat import AsGiven, ChatMessage

VERSION = "v0"
MAX_BODY_BYTES = 256 * 1024  # the SQS message size limit

StopReason = Literal["end_of_conversation", "max_turns", "timeout", "env_error"]


# SQS FIFO message group and deduplication ids: 1-128 alphanumeric and punctuation characters
# (botocore's SendMessage documentation of MessageGroupId and MessageDeduplicationId).
_FIFO_ID = re.compile(r"[!-~]{1,128}")
ID_LENGTH = 128  # sample and step ids
# The metric by which a finished rollout says its episode succeeded (1) or not (0): the
# environment's `success` flag (reward_envs/interface.py), which the pipeline's pass rates count.
SUCCESS_METRIC = "env/success"


def fifo_id(value: str) -> str:
    """`value` as an SQS FIFO group or deduplication id: itself when SQS takes it, else a
    digest of it (as unique; a sample id may hold spaces or letters SQS refuses)."""
    if _FIFO_ID.fullmatch(value):
        return value
    return f"sha256-{hashlib.sha256(value.encode()).hexdigest()}"


def sample_id_for(record_id: str, number: int) -> str:
    """The id of a record's `number`th sample, `<record id>_<number>`, the record id cut to fit
    ID_LENGTH; `RolloutRequest.record_id` reads the (cut) record id back."""
    suffix = f"_{number}"
    return record_id[: ID_LENGTH - len(suffix)] + suffix


def record_id_of(sample_id: str) -> str:
    """The dataset record a sample was drawn from (`<record id>_<k>`, `sample_id_for`); a sample
    id of another form is its own record."""
    head, separator, tail = sample_id.rpartition("_")
    return head if separator and tail.isdigit() else sample_id


def episode_seed(run_id: str, record_id: str) -> int:
    """The seed an environment draws a record's episode with in a run (what it does not take
    from the record, e.g. a Wordle secret when the record names none): the same for every sample
    of the record, so a group plays one task; different across runs; reproducible."""
    digest = hashlib.sha256(f"{run_id}\0{record_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def step_id_for(sample_id: str, turn: int) -> str:
    """The id of a sample's `turn`th model turn, `<sample id>_<turn>`, shortened with a digest
    of the sample id when that would pass ID_LENGTH (ids stay unique per sample and turn)."""
    suffix = f"_{turn}"
    if len(sample_id) + len(suffix) <= ID_LENGTH:
        return f"{sample_id}{suffix}"
    digest = hashlib.sha256(sample_id.encode()).hexdigest()[:16]
    return f"{sample_id[: ID_LENGTH - len(suffix) - 17]}~{digest}{suffix}"


def turn_of(step_id: str) -> int:
    """The turn of a step id (`step_id_for`); -1 when it does not end in one."""
    _, _, tail = step_id.rpartition("_")
    return int(tail) if tail.isdigit() else -1


class ProtocolError(ValueError):
    """A message that is not valid v0; the text names the field and the problem."""


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    version: Literal["v0"] = VERSION


class RewardSpec(BaseModel):
    model_config = ConfigDict(frozen=True)

    range: tuple[float, float] = (0.0, 1.0)

    @model_validator(mode="after")
    def _ordered(self) -> RewardSpec:
        low, high = self.range
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise ValueError(
                f"rewards.range must be finite [low, high] with low < high, got {list(self.range)}"
            )
        return self


class RolloutRequest(_Message):
    """Trainer → workers (queue `rollout-requests`): play one episode of one sample."""

    # AWS's documented example sends an ISO 8601 string; our trainers send epoch seconds.
    timestamp: float | str = Field(default_factory=time.time)
    sample_id: str = Field(min_length=1, max_length=ID_LENGTH)
    max_length: int = Field(default=10240, gt=0)
    rewards: RewardSpec = RewardSpec()
    data: dict[str, Any]

    @field_validator("data")
    @classmethod
    def _has_task(cls, data: dict[str, Any]) -> dict[str, Any]:
        if "prompt" not in data and "problem" not in data and "answer" not in data:
            raise ValueError("data needs at least one of prompt, problem or answer")
        return data

    @property
    def record_id(self) -> str:
        return record_id_of(self.sample_id)


class Metric(BaseModel):
    """One named number of a finished rollout. `type` as Nova's starter-kit client reports it
    (aws-samples/sample-nova-multi-turn-rl-infra, client/nova_async_client.py, `RolloutMetric`):
    "Reward" for a component of the training signal, "Metric" for one only tracked."""

    model_config = ConfigDict(frozen=True)

    name: str
    value: float
    type: Literal["Reward", "Metric"] = "Metric"


class RolloutResponse(_Message):
    """Workers → trainer (queue `rollout-responses`): how one episode ended.

    `aggregate_score` is None when there is no honest reward to give (`timeout`, `env_error`):
    an environment failure is never reported as a reward of 0.
    """

    sample_id: str = Field(min_length=1, max_length=ID_LENGTH)
    stop_reason: StopReason
    rewards: dict[str, float | None]
    metrics: list[Metric] = []
    error: str | None = None

    @model_validator(mode="after")
    def _score_matches_reason(self) -> RolloutResponse:
        score = self.rewards.get("aggregate_score")
        if self.stop_reason in ("timeout", "env_error"):
            if score is not None:
                raise ValueError(
                    f"a rollout stopped by {self.stop_reason!r} has no aggregate_score: send null"
                )
        elif score is None or not math.isfinite(score):
            raise ValueError(
                f"a rollout stopped by {self.stop_reason!r} needs a finite aggregate_score "
                "(or stop_reason 'timeout' or 'env_error' with the error)"
            )
        return self

    @property
    def aggregate_score(self) -> float | None:
        return self.rewards.get("aggregate_score")

    @property
    def succeeded(self) -> bool | None:
        """The episode's success flag, None when the rollout reports none."""
        flags = [metric.value for metric in self.metrics if metric.name == SUCCESS_METRIC]
        return flags[-1] >= 0.5 if flags else None

    def for_nova(self) -> NovaRolloutResponse | None:
        """This response as Nova's trainer is documented to take it (`NovaRolloutResponse`);
        None for a rollout without a score, which has no documented form."""
        score = self.aggregate_score
        if score is None:
            return None
        return NovaRolloutResponse(
            sample_id=self.sample_id, rewards=NovaRewards(aggregate_score=score)
        )


class NovaRewards(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    aggregate_score: float = Field(allow_inf_nan=False)


class NovaRolloutResponse(_Message):
    """A rollout response exactly as the Nova user guide documents it ("Reinforcement Learning",
    nova-hp-rft-forge, "BYOO request and response formats"): `version`, `sample_id`,
    `stop_reason` "end_of_conversation" and `rewards.aggregate_score`, a number, and nothing
    else. What Nova's trainer gets for a sample its rollout Lambda forwarded: a rollout that
    reached its turn limit ended its conversation too; our metrics, errors and failure reasons
    stay with the run's records and trajectories."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sample_id: str = Field(min_length=1, max_length=ID_LENGTH)
    stop_reason: Literal["end_of_conversation"] = "end_of_conversation"
    rewards: NovaRewards


class GenerateRequest(_Message):
    """Proxy → trainer (queue `generate-requests`): the next model turn of a conversation, and
    the tools the model may call (OpenAI's `tools` and `tool_choice`, as the environment sent
    them; absent when it sent none)."""

    sample_id: str = Field(min_length=1, max_length=ID_LENGTH)
    step_id: str = Field(min_length=1, max_length=ID_LENGTH)
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None

    @model_serializer(mode="wrap")
    def _without_absent_tools(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        dumped = handler(self)
        for key in ("tools", "tool_choice"):
            if dumped.get(key) is None:
                dumped.pop(key, None)
        return dumped


class TokenLogprob(BaseModel):
    model_config = ConfigDict(frozen=True)

    token: str
    logprob: float


class CompletionMessage(ChatMessage):
    """The model's turn in a generate response: text (AWS's documented example gives only
    `content`), tool calls, or both."""

    role: Literal["assistant"] = "assistant"


class Choice(AsGiven):
    message: CompletionMessage
    finish_reason: str | None = None
    logprobs: dict[str, list[TokenLogprob]] | None = None


class Generation(AsGiven):
    """A generate response's `data`: OpenAI-shaped `choices`, and what else the generation
    service adds (AWS's documented example: `serving_model_num`)."""

    choices: list[Choice]


class GenerateResponse(_Message):
    """Trainer → router (queue `generate-responses`): the completion for one step."""

    sample_id: str = Field(min_length=1, max_length=ID_LENGTH)
    step_id: str = Field(min_length=1, max_length=ID_LENGTH)
    data: Generation
    finish_reason: str | None = None

    def completion(self) -> dict[str, Any]:
        """The OpenAI-shaped part (`choices`) as plain JSON data, as the trainer gave it; a
        choice that names no finish_reason takes the response's own."""
        data = self.data.model_dump(mode="json")
        if self.finish_reason is not None:
            for choice in data.get("choices", []):
                if choice.get("finish_reason") is None:
                    choice["finish_reason"] = self.finish_reason
        return data

    @property
    def content(self) -> str:
        choices = self.data.choices
        return (choices[0].message.content or "") if choices else ""


def parse(kind: type[_Message], body: str | bytes) -> Any:
    """`body` as a `kind` message, or ProtocolError naming what is wrong."""
    if len(body) > MAX_BODY_BYTES:
        raise ProtocolError(f"{kind.__name__}: body of {len(body)} bytes exceeds {MAX_BODY_BYTES}")
    try:
        raw = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ProtocolError(f"{kind.__name__}: not JSON ({error})") from None
    if not isinstance(raw, dict):
        raise ProtocolError(f"{kind.__name__}: expected a JSON object, got {type(raw).__name__}")
    if raw.get("version") != VERSION:
        raise ProtocolError(
            f"{kind.__name__}: unsupported version {raw.get('version')!r}, expected {VERSION!r}"
        )
    try:
        return kind.model_validate(raw)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "message"
        raise ProtocolError(f"{kind.__name__}: {where}: {first['msg']}") from None


def dump(message: _Message) -> str:
    return message.model_dump_json()


# --- The proxy's HTTP bodies (OpenAI-shaped, served by the router's Function URL) -----------

StepState = Literal["pending", "processing", "completed", "failed"]

# A run's base URL: the router's URL, then `/runs/<run id>/<run token>`. Nova's starter-kit
# client (aws-samples/sample-nova-multi-turn-rl-infra, client/nova_async_client.py) is given a
# base URL and SigV4 credentials and sends nothing else of its own, so a run's identity and the
# proof of it travel in the path; the client appends `/v1/chat/completions` and the rest.
_RUN_PATH = re.compile(r"/runs/(?P<run_id>[^/]+)/(?P<token>[^/]+)(?P<route>/.*)?")


def run_base_url(router_url: str, run_id: str, token: str) -> str:
    """The URL an OpenAI-style client of this run is given as its base URL."""
    return f"{router_url.rstrip('/')}/runs/{quote(run_id, safe='')}/{quote(token, safe='')}"


def split_run_path(path: str) -> tuple[str, str, str] | None:
    """`(run id, token, route)` of a path under a run's base URL, or None when it is not one."""
    match = _RUN_PATH.fullmatch(path)
    if match is None:
        return None
    return unquote(match["run_id"]), unquote(match["token"]), match["route"] or "/"


class ChatCompletionRequest(BaseModel):
    """`POST /v1/chat/completions`: an OpenAI chat request; extra OpenAI fields are kept."""

    model_config = ConfigDict(extra="allow", frozen=True)

    messages: list[ChatMessage] = Field(min_length=1, max_length=1000)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    model: str | None = None
    user: str | None = None
    # Where Nova's starter-kit client (aws-samples/sample-nova-multi-turn-rl-infra,
    # client/nova_async_client.py) names the sample: it sends no headers of its own.
    sample_id: str | None = None


def chat_completion(
    step_id: str, completion: dict[str, Any], *, created: float, model: str
) -> dict[str, Any]:
    """A step's answer (`GenerateResponse.completion()`) as an OpenAI `chat.completion` object
    with every field OpenAI's own types require (openai-python, `ChatCompletion`): `id`,
    `object`, `created`, `model`, and per choice `index` and `finish_reason` ("stop" when the
    generation named none: it ended), and per logprob token `top_logprobs` (empty when not
    sampled). Clients that validate the answer, as Nova's starter-kit client does, accept it."""
    choices = []
    for index, choice in enumerate(completion.get("choices", [])):
        shaped = {**choice, "index": index, "finish_reason": choice.get("finish_reason") or "stop"}
        if choice.get("logprobs"):  # validated by `Choice`: lists of tokens by key
            shaped["logprobs"] = {
                key: [{"top_logprobs": [], **token} for token in tokens]
                for key, tokens in choice["logprobs"].items()
            }
        choices.append(shaped)
    return {
        **completion,
        "id": step_id,
        "object": "chat.completion",
        "created": int(created),
        "model": model,
        "choices": choices,
    }


class StepStatus(BaseModel):
    """`GET /v1/chat/completions/{step_id}` (and a `POST` that did not finish in time)."""

    model_config = ConfigDict(frozen=True)

    step_id: str
    status: StepState
    result: dict[str, Any] | None = None


class RolloutReport(BaseModel):
    """`POST /v1/rollouts/report`: an environment outside our workers reports a finished rollout."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    id: str = Field(min_length=1, max_length=ID_LENGTH)
    aggregate_reward_score: float | None
    metrics_list: list[Metric] = []
    stop_reason: StopReason = "end_of_conversation"
    error: str | None = None
    # What a retry of this report repeats (our worker: the rollout request's SQS message id);
    # without it, the sample id (`id`) deduplicates.
    request_id: str | None = Field(default=None, min_length=1, max_length=ID_LENGTH)

    def as_response(self) -> RolloutResponse:
        return RolloutResponse(
            sample_id=self.id,
            stop_reason=self.stop_reason,
            rewards={"aggregate_score": self.aggregate_reward_score},
            metrics=self.metrics_list,
            error=self.error,
        )
