"""The training dataset: one JSON object per line, Nova multi-turn RFT's record format.

    {"id": "wordle-1", "metadata": {"prompt": "..." | [chat messages], "answer": "crane",
                                    "task": "wordle", "info": {...} | "<JSON text>"}}

The verdict on a record is AWS's: the rules of amzn-nova-forge's `RFTMultiturnDatasetSample`
(amzn_nova_forge/dataset/dataset_validator/rft_multiturn_dataset_validator.py, 1.4.10), which
`tests/mtrl/test_dataset_against_aws.py` holds ours against on generated records. On top of it,
what the Nova user guide's BYOO data preparation section shows (nova-hp-rft-forge, "Data
preparation for custom RL environments"): optional top-level `messages` and `tools`, and a
`metadata.problem` in place of a prompt; they are passed on to the environment.

This module is the one home of the schema: the validate Lambda, `mtrl validate`, the local
mode and the trainer all read datasets through it. Validation streams: memory grows only with
the number of records (16 bytes each, for the duplicate-id check) and the problems kept (the
first `keep`, by line), never with the file size. UTF-8 with or without BOM, CRLF line ends and
blank lines are accepted. One fault is one problem, in words: `line 3: metadata.prompt: must be a
string or a list of chat messages`.
"""

from __future__ import annotations

import hashlib
import heapq
import io
import json
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any, BinaryIO

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from domain.chat import ChatMessage

MAX_LINE_BYTES = 1024 * 1024
MAX_FILE_BYTES = 10 * 1024**3
MAX_KEPT_PROBLEMS = 1000  # the problems a validation keeps to show (all are counted)
_BOM = b"\xef\xbb\xbf"


class DatasetMessage(ChatMessage):
    """A chat message in a record, by AWS's rules (stricter than the API's): system, user and
    tool messages need non-empty text."""

    @model_validator(mode="after")
    def _text_where_aws_wants_it(self) -> DatasetMessage:
        if self.role != "assistant" and not (self.content or "").strip():
            raise ValueError(f"a {self.role} message needs non-empty content")
        return self


def _prompt_kind(value: Any) -> str | None:
    """Which form a prompt has, so only that form's errors are reported (a tag is `<...>`,
    never a field name: _describe leaves tags out of a problem's place)."""
    if isinstance(value, str):
        return "<text>"
    return "<messages>" if isinstance(value, list) else None


Prompt = Annotated[
    Annotated[str, Tag("<text>")] | Annotated[list[DatasetMessage], Tag("<messages>")],
    Discriminator(
        _prompt_kind,
        custom_error_type="prompt_type",
        custom_error_message="must be a string or a list of chat messages",
    ),
]


class RecordMetadata(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    problem: str | None = None  # the BYOO data preparation's form of the task
    prompt: Prompt | None = Field(default=None, validate_default=True)
    answer: str | None = None
    task: str | None = None
    info: dict[str, Any] | str | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt_not_empty(
        cls, prompt: str | list[DatasetMessage] | None, info: ValidationInfo
    ) -> str | list[DatasetMessage] | None:
        if prompt is None and info.data.get("problem") is None:
            raise ValueError(
                "Field required: text or chat messages (or a metadata.problem, the form Nova's "
                "BYOO data preparation shows)"
            )
        if isinstance(prompt, str) and not prompt.strip():
            raise ValueError("must not be empty")
        if prompt is not None and not prompt:
            raise ValueError("must have at least one message")
        return prompt

    @field_validator("info")
    @classmethod
    def _info_is_json(cls, info: dict[str, Any] | str | None) -> dict[str, Any] | str | None:
        if isinstance(info, str):
            try:
                json.loads(info)
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"must be an object or a string of JSON text ({error.msg} at character "
                    f"{error.pos + 1})"
                ) from None
            except RecursionError:  # Python's parser stops a deep nesting this way
                raise ValueError(
                    "must be an object or a string of JSON text (nested too deeply to parse: "
                    "flatten it)"
                ) from None
        return info


class DatasetRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    metadata: RecordMetadata
    # Nova's BYOO data preparation: optional conversation and OpenAI tool definitions.
    messages: list[DatasetMessage] | None = None
    tools: list[dict[str, Any]] | None = None

    @field_validator("id")
    @classmethod
    def _id_not_blank(cls, record_id: str) -> str:
        if not record_id.strip():
            raise ValueError("must not be empty or only whitespace")
        return record_id.strip()  # as AWS keeps it

    def rollout_data(self) -> dict[str, Any]:
        """The `data` of this record's rollout requests: its metadata as given, and its
        `messages` and `tools` when it has any (values read from JSON dump as JSON)."""
        data = self.metadata.model_dump(exclude_none=True)
        if self.messages:
            data["messages"] = [message.model_dump(exclude_none=True) for message in self.messages]
        if self.tools:
            data["tools"] = list(self.tools)
        return data


@dataclass(frozen=True)
class Problem:
    line: int | None  # None: about the whole file
    field: str | None  # None: about the whole line (or file)
    message: str

    def __str__(self) -> str:
        where = "file" if self.line is None else f"line {self.line}"
        return (
            f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {"line": self.line, "field": self.field, "message": self.message}


def counted(count: int, noun: str) -> str:
    """ "1 problem", "3 problems"."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


@dataclass
class Summary:
    records: int = 0
    lines: int = 0
    bytes: int = 0
    problems: int = 0
    duplicate_ids: int = 0
    _hashes: array = field(default_factory=lambda: array("Q"), repr=False)
    _lines: array = field(default_factory=lambda: array("Q"), repr=False)

    @property
    def valid(self) -> bool:
        return self.problems == 0 and self.records > 0


class DatasetValidator:
    """`problems(stream)`: the first `keep` problems in line order (the file's own first), once
    the whole stream is read; `summary` counts them all."""

    def __init__(
        self,
        *,
        max_line_bytes: int = MAX_LINE_BYTES,
        max_file_bytes: int = MAX_FILE_BYTES,
        keep: int = MAX_KEPT_PROBLEMS,
    ) -> None:
        self.max_line_bytes = max_line_bytes
        self.max_file_bytes = max_file_bytes
        self.keep = keep
        self.summary = Summary()

    def problems(self, stream: BinaryIO) -> Iterator[Problem]:
        # A duplicate id is only known at the end: keep the `keep` earliest problems (a heap of
        # negated (line, order), the latest on top) and give them sorted.
        kept: list[tuple[int, int, Problem]] = []
        for order, problem in enumerate(self._scan(stream)):
            self.summary.problems += 1
            entry = (-(problem.line or 0), -order, problem)
            if len(kept) < self.keep:
                heapq.heappush(kept, entry)
            elif entry > kept[0]:
                heapq.heapreplace(kept, entry)
        yield from (problem for *_, problem in sorted(kept, reverse=True))

    def _scan(self, stream: BinaryIO) -> Iterator[Problem]:
        summary = self.summary
        for number, raw, size in _lines(stream, self.max_line_bytes):
            summary.lines = number
            summary.bytes += size
            if summary.bytes > self.max_file_bytes:
                yield Problem(
                    None, None, f"larger than {self.max_file_bytes} bytes; split the dataset"
                )
                return
            if raw is _TOO_LONG:
                yield Problem(number, None, f"longer than {self.max_line_bytes} bytes")
                continue
            if number == 1 and raw.startswith(_BOM):
                raw = raw[len(_BOM) :]
            if not raw.strip():
                continue
            try:
                record = DatasetRecord.model_validate_json(raw)
            except ValidationError as error:
                yield from _describe(number, raw, error)
                continue
            summary.records += 1
            summary._hashes.append(
                int.from_bytes(hashlib.blake2b(record.id.encode(), digest_size=8).digest())
            )
            summary._lines.append(number)
        if summary.records == 0 and summary.problems == 0:
            yield Problem(None, None, "no records: the file is empty or only blank lines")
        yield from self._duplicates()

    def _duplicates(self) -> Iterator[Problem]:
        hashes = np.frombuffer(self.summary._hashes, dtype=np.uint64)
        lines = np.frombuffer(self.summary._lines, dtype=np.uint64)
        if len(hashes) < 2:
            return
        order = np.argsort(hashes, kind="stable")
        repeated = np.flatnonzero(hashes[order][1:] == hashes[order][:-1]) + 1
        first_of = {}
        for position in repeated:
            later = int(lines[order[position]])
            first = first_of.setdefault(
                int(hashes[order[position]]), int(lines[order[position - 1]])
            )
            self.summary.duplicate_ids += 1
            yield Problem(later, "id", f"duplicate of the id on line {first}")


_TOO_LONG = b"\0too long\0"


def _lines(stream: BinaryIO, limit: int) -> Iterator[tuple[int, bytes, int]]:
    """Numbered lines, their line end included (JSON takes it as whitespace), and the bytes
    each took in the file; an over-long line is yielded as _TOO_LONG."""
    number = 0
    while True:
        line = stream.readline(limit + 2)
        if not line:
            return
        number += 1
        if len(line.rstrip(b"\r\n")) > limit:
            size = len(line)
            while line and not line.endswith(b"\n"):  # skip the rest of the line, chunk by chunk
                line = stream.readline(limit)
                size += len(line)
            yield number, _TOO_LONG, size
            continue
        yield number, line, len(line)


def _describe(number: int, raw: bytes, error: ValidationError) -> Iterator[Problem]:
    for detail in error.errors(include_url=False):
        kind = detail["type"]
        if kind == "json_invalid":
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as bad:
                yield Problem(number, None, f"not valid UTF-8 (byte {bad.start + 1})")
                return
            reason = detail["ctx"]["error"].replace("at line 1 column", "at column")
            yield Problem(number, None, f"not valid JSON ({reason})")
            return
        if kind == "model_type" and not detail["loc"]:
            yield Problem(
                number, None, 'not a JSON object; each line must be {"id": ..., "metadata": {...}}'
            )
            return
        location = ".".join(str(part) for part in detail["loc"] if not str(part).startswith("<"))
        if kind == "extra_forbidden":
            message = _NOT_ALLOWED[location.startswith("metadata.")]
        else:
            message = _MESSAGES.get(kind) or detail["msg"].removeprefix("Value error, ")
        yield Problem(number, location, message)


# Pydantic's words where a dataset's author needs others.
_MESSAGES = {
    "model_type": "must be a JSON object",
    "model_attributes_type": "must be a JSON object",
}
_NOT_ALLOWED = {
    False: "not allowed here (a record has id, metadata, and optionally messages and tools)",
    True: "not allowed in metadata (prompt, problem, answer, task, info): put other data in info",
}


def read_records(stream: BinaryIO) -> Iterator[DatasetRecord]:
    """The records of a dataset already validated (raises ValueError on the first bad line)."""
    for number, raw, _ in _lines(stream, MAX_LINE_BYTES):
        if raw is _TOO_LONG:
            raise ValueError(f"line {number}: longer than {MAX_LINE_BYTES} bytes")
        raw = raw[len(_BOM) :] if number == 1 and raw.startswith(_BOM) else raw
        if raw.strip():
            try:
                yield DatasetRecord.model_validate_json(raw)
            except ValidationError as error:
                raise ValueError(str(next(_describe(number, raw, error)))) from None


def read_dataset_object(
    s3: Any, *, bucket: str, key: str, version: str | None
) -> list[DatasetRecord]:
    """The records of a dataset object already validated: at `version` when given, else as it
    is now."""
    extra = {"VersionId": version} if version else {}
    body = s3.get_object(Bucket=bucket, Key=key, **extra)["Body"].read()
    return list(read_records(io.BytesIO(body)))
