"""Validate an uploaded dataset straight from S3, streaming, and write the report next to the run.

The report (`runs/<run_id>/validation.json`) lists problems with line numbers (the validator
keeps the first `domain.dataset.MAX_KEPT_PROBLEMS`, in line order; the count is always
complete). Nothing else is created by this step, so an invalid dataset leaves nothing behind.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any

from domain.bucket import run_output_prefix
from domain.dataset import DatasetValidator


@dataclass(frozen=True)
class ValidationOutcome:
    valid: bool
    records: int
    problems: int
    report_key: str
    first_problems: list[str]


class _Body(io.RawIOBase):
    """An S3 StreamingBody as a raw stream, so it can be buffered and read line by line."""

    def __init__(self, body: Any) -> None:
        self._body = body

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        chunk = self._body.read(len(buffer))
        buffer[: len(chunk)] = chunk
        return len(chunk)


def validate_upload(
    s3: Any, *, bucket: str, key: str, version_id: str | None, run_id: str
) -> ValidationOutcome:
    extra = {"VersionId": version_id} if version_id else {}
    body = s3.get_object(Bucket=bucket, Key=key, **extra)["Body"]
    validator = DatasetValidator()
    with io.BufferedReader(_Body(body), buffer_size=1024 * 1024) as stream:
        reported = list(validator.problems(stream))
    summary = validator.summary
    report_key = f"{run_output_prefix(run_id)}validation.json"
    report = {
        "dataset": f"s3://{bucket}/{key}",
        "version_id": version_id,
        "valid": summary.valid,
        "records": summary.records,
        "lines": summary.lines,
        "problems": summary.problems,
        "first_problems": [problem.as_dict() for problem in reported],
    }
    s3.put_object(
        Bucket=bucket,
        Key=report_key,
        Body=json.dumps(report, indent=2).encode(),
        ContentType="application/json",
    )
    first = [str(problem) for problem in reported[:20]]
    return ValidationOutcome(summary.valid, summary.records, summary.problems, report_key, first)
