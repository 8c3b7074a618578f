"""The trajectories' Glue table and Athena workgroup: the columns are the store's schema, the
projected partitions find the folders the workers write, and query results stay encrypted in
the data bucket. Property names from the Athena User Guide ("Use partition projection with
Amazon Athena", "Supported types for partition projection")."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from domain.bucket import QUERY_RESULTS_PREFIX, trajectories_prefix
from domain.trajectories import HOUR_FORMAT, SCHEMA, hour_of, object_key
from stacks.components.trajectory_table import HOUR_FORMAT as JAVA_HOUR_FORMAT
from stacks.components.trajectory_table import hive_type
from tests.conftest import Synthesized

# Java DateTimeFormatter letters Athena reads -> the strftime directives the store writes.
JAVA_TO_STRFTIME = {"yyyy": "%Y", "MM": "%m", "dd": "%d", "HH": "%H"}


def _table(app: Synthesized) -> dict:
    _, table = app.one("storage", "AWS::Glue::Table")
    return table["Properties"]["TableInput"]


def test_the_columns_are_the_stores_schema_in_hive_types(default_app: Synthesized) -> None:
    columns = _table(default_app)["StorageDescriptor"]["Columns"]
    assert [column["Name"] for column in columns] == SCHEMA.names
    types = {column["Name"]: column["Type"] for column in columns}
    assert types["finished_at"] == "timestamp" and types["reward"] == "double"
    assert types["turn_rewards"] == "array<double>" and types["policy_version"] == "bigint"
    assert types["metrics"] == "map<string,double>"
    # The partition keys are not columns of the files (Athena refuses duplicates).
    keys = [key["Name"] for key in _table(default_app)["PartitionKeys"]]
    assert keys == ["run", "hour"] and not set(keys) & set(SCHEMA.names)


def test_a_type_the_table_cannot_say_is_refused_not_guessed() -> None:
    with pytest.raises(ValueError, match="no Hive type"):
        hive_type(pa.float16())


def test_projection_finds_the_files_the_workers_write(default_app: Synthesized) -> None:
    parameters = _table(default_app)["Parameters"]
    assert parameters["projection.enabled"] == "true"
    assert parameters["projection.run.type"] == "injected"
    assert (parameters["projection.hour.type"], parameters["projection.hour.interval.unit"]) == (
        "date",
        "HOURS",
    )
    assert parameters["projection.hour.range"].endswith(",NOW")
    # The hour's format, in Athena's letters, is the one the store writes folders with.
    java = parameters["projection.hour.format"]
    assert java == JAVA_HOUR_FORMAT
    assert re.sub("|".join(JAVA_TO_STRFTIME), lambda m: JAVA_TO_STRFTIME[m[0]], java) == (
        HOUR_FORMAT
    )
    # The template, filled in for a run and an hour, is the folder of the store's object key.
    template = parameters["storage.location.template"]
    (prefix,) = [
        part for part in template["Fn::Join"][1] if isinstance(part, str) and "${run}" in part
    ]
    moment = datetime(2026, 12, 3, 7, 15, tzinfo=UTC)
    folder = prefix.replace("${run}", "wordle-0a1b2c3d4e").replace("${hour}", hour_of(moment))
    key = object_key(trajectories_prefix("wordle-0a1b2c3d4e"), hour_of(moment), "w1", 0)
    assert f"/{key}".startswith(folder) and folder.endswith(
        "/trajectories/wordle-0a1b2c3d4e/hour=2026-12-03-07/"
    )


def test_query_results_are_kept_encrypted_in_the_data_bucket(default_app: Synthesized) -> None:
    _, workgroup = default_app.one("storage", "AWS::Athena::WorkGroup")
    configuration = workgroup["Properties"]["WorkGroupConfiguration"]
    assert configuration["EnforceWorkGroupConfiguration"] is True
    results = configuration["ResultConfiguration"]
    assert results["EncryptionConfiguration"]["EncryptionOption"] == "SSE_KMS"
    key_id, _ = default_app.one("storage", "AWS::KMS::Key")
    assert results["EncryptionConfiguration"]["KmsKey"] == {"Fn::GetAtt": [key_id, "Arn"]}
    location = results["OutputLocation"]["Fn::Join"][1]
    assert location[-1] == f"/{QUERY_RESULTS_PREFIX}"
    buckets = default_app.resources("storage", "AWS::S3::Bucket")
    (data,) = [key for key in buckets if key.startswith("StorageData")]
    assert {"Ref": data} in location
    rules = buckets[data]["Properties"]["LifecycleConfiguration"]["Rules"]
    assert {"Id": "expire-query-results", "Prefix": QUERY_RESULTS_PREFIX, "ExpirationInDays": 30, "Status": "Enabled"} in rules  # fmt: skip
