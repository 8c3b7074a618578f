"""SQL over every run's trajectories with no setup: a Glue table on the data bucket's
`trajectories/<run>/hour=<hour>/` Parquet files, and an Athena workgroup that keeps its
query results (encrypted with the data key) in the bucket.

The table's columns are the trajectory store's one schema (domain/trajectories.py) in Hive's
types. Partitions are projected, never crawled or registered (Athena User Guide, "Use partition
projection with Amazon Athena" and "Supported types for partition projection"): `run` is
`injected` — a query names the run (`WHERE run = '...'`), which is also what keeps it cheap —
and `hour` is a `date` in hours from the deployment's first year to now.
"""

from __future__ import annotations

import pyarrow as pa
from aws_cdk import Aws
from aws_cdk import aws_athena as athena
from aws_cdk import aws_glue as glue
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from domain.bucket import QUERY_RESULTS_PREFIX, TRAJECTORIES_PREFIX
from domain.trajectories import SCHEMA

TABLE = "trajectories"
# Athena's date projection: the format of the store's hour folders (domain.trajectories), in
# Java's DateTimeFormatter letters, and the first hour a trajectory can have.
HOUR_FORMAT = "yyyy-MM-dd-HH"
FIRST_HOUR = "2026-01-01-00"


def hive_type(kind: pa.DataType) -> str:
    """The Glue/Hive column type Athena reads a Parquet column of `kind` as."""
    if pa.types.is_list(kind):
        return f"array<{hive_type(kind.value_type)}>"
    if pa.types.is_map(kind):
        return f"map<{hive_type(kind.key_type)},{hive_type(kind.item_type)}>"
    simple = {
        pa.string(): "string",
        pa.float64(): "double",
        pa.int32(): "int",
        pa.int64(): "bigint",
        pa.bool_(): "boolean",
    }
    if pa.types.is_timestamp(kind):
        return "timestamp"
    if kind in simple:
        return simple[kind]
    raise ValueError(f"no Hive type for {kind}: add it here")


def database_name(name_prefix: str) -> str:
    """Glue database names are lower case with underscores."""
    return name_prefix.replace("-", "_")


class TrajectoryTable(Construct):
    """Attributes: `database_name`, `table_name`, `workgroup_name`."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        name_prefix: str,
        data_bucket: s3.IBucket,
        data_key: kms.IKey,
    ) -> None:
        super().__init__(scope, construct_id)
        self.database_name = database_name(name_prefix)
        self.table_name = TABLE
        self.workgroup_name = name_prefix
        database = glue.CfnDatabase(
            self,
            "Database",
            catalog_id=Aws.ACCOUNT_ID,
            database_input=glue.CfnDatabase.DatabaseInputProperty(
                name=self.database_name,
                description=f"{name_prefix}: what runs kept (trajectories)",
            ),
        )
        root = f"s3://{data_bucket.bucket_name}/{TRAJECTORIES_PREFIX}"
        table = glue.CfnTable(
            self,
            "Table",
            catalog_id=Aws.ACCOUNT_ID,
            database_name=self.database_name,
            table_input=glue.CfnTable.TableInputProperty(
                name=self.table_name,
                description="Every finished rollout of every run (domain/trajectories.py)",
                table_type="EXTERNAL_TABLE",
                partition_keys=[
                    glue.CfnTable.ColumnProperty(name="run", type="string"),
                    glue.CfnTable.ColumnProperty(name="hour", type="string"),
                ],
                parameters={
                    "classification": "parquet",
                    "projection.enabled": "true",
                    "projection.run.type": "injected",
                    "projection.hour.type": "date",
                    "projection.hour.format": HOUR_FORMAT,
                    "projection.hour.range": f"{FIRST_HOUR},NOW",
                    "projection.hour.interval": "1",
                    "projection.hour.interval.unit": "HOURS",
                    "storage.location.template": f"{root}${{run}}/hour=${{hour}}/",
                },
                storage_descriptor=glue.CfnTable.StorageDescriptorProperty(
                    location=root,
                    columns=[
                        glue.CfnTable.ColumnProperty(name=field.name, type=hive_type(field.type))
                        for field in SCHEMA
                    ],
                    input_format="org.apache.hadoop.hive.ql.io.parquet.MapredParquetInputFormat",
                    output_format="org.apache.hadoop.hive.ql.io.parquet.MapredParquetOutputFormat",
                    serde_info=glue.CfnTable.SerdeInfoProperty(
                        serialization_library=(
                            "org.apache.hadoop.hive.ql.io.parquet.serde.ParquetHiveSerDe"
                        )
                    ),
                ),
            ),
        )
        table.add_dependency(database)
        athena.CfnWorkGroup(
            self,
            "WorkGroup",
            name=self.workgroup_name,
            description=f"{name_prefix}: queries over the trajectories table",
            recursive_delete_option=True,
            work_group_configuration=athena.CfnWorkGroup.WorkGroupConfigurationProperty(
                enforce_work_group_configuration=True,
                publish_cloud_watch_metrics_enabled=True,
                result_configuration=athena.CfnWorkGroup.ResultConfigurationProperty(
                    output_location=f"s3://{data_bucket.bucket_name}/{QUERY_RESULTS_PREFIX}",
                    encryption_configuration=athena.CfnWorkGroup.EncryptionConfigurationProperty(
                        encryption_option="SSE_KMS", kms_key=data_key.key_arn
                    ),
                ),
            ),
        )
