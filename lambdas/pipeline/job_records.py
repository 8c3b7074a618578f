"""The records a job of AWS's reads from S3, written beside the run's outputs: the dataset
without its held-out records (what it trains on), and the held-out ones (what it evaluates on;
domain/evaluation.py chooses them). Nova's HyperPod plane and the serverless plane share them."""

from __future__ import annotations

from typing import Any

from domain.backends import EvaluationUnsupported, RunContext
from domain.dataset import DatasetRecord, read_dataset_object
from domain.evaluation import (
    EVALUATION_RECORDS_OBJECT,
    TRAINING_RECORDS_OBJECT,
    evaluation_records,
    evaluation_source,
    training_records,
)


def write_records(s3: Any, run: RunContext, key: str, records: list[DatasetRecord]) -> str:
    """`records` as JSON lines at `key` of the run's bucket; their S3 URI."""
    lines = "".join(record.model_dump_json(exclude_none=True) + "\n" for record in records)
    s3.put_object(
        Bucket=run.bucket, Key=key, Body=lines.encode(), ContentType="application/x-ndjson"
    )
    return f"s3://{run.bucket}/{key}"


def training_data(s3: Any, run: RunContext, *, always_written: bool = False) -> str:
    """The records the job trains on: the dataset, without the held-out ones when a share is
    held out (then written beside the run's outputs, as they are with `always_written`)."""
    config = run.training
    if config.held_out_fraction <= 0 and not always_written:
        return f"s3://{run.bucket}/{run.dataset_key}"
    found = read_dataset_object(
        s3, bucket=run.bucket, key=run.dataset_key, version=run.dataset_version
    )
    key = f"{run.output_prefix}{TRAINING_RECORDS_OBJECT}"
    return write_records(s3, run, key, training_records(found, config))


def held_out_records(s3: Any, run: RunContext) -> list[DatasetRecord]:
    """The records the run evaluates on (EvaluationUnsupported: none is held out)."""
    source_key, version = evaluation_source(run.training, run.dataset_key, run.dataset_version)
    records = evaluation_records(
        read_dataset_object(s3, bucket=run.bucket, key=source_key, version=version),
        run.training,
        named_file=run.training.eval_dataset is not None,
    )
    if not records:
        raise EvaluationUnsupported(
            f"no record of s3://{run.bucket}/{source_key} is held out for evaluation "
            f"(eval_fraction {run.training.held_out_fraction}); raise eval_fraction or name "
            "an eval_dataset"
        )
    return records


def evaluation_data(s3: Any, run: RunContext, records: list[DatasetRecord]) -> str:
    """The held-out records, written beside the run's outputs; their S3 URI."""
    return write_records(s3, run, f"{run.output_prefix}{EVALUATION_RECORDS_OBJECT}", records)
