"""The storage stack: encrypted, versioned, SSL-only data bucket with EventBridge; log and script buckets."""

from __future__ import annotations

import json

from domain.bucket import (
    CONFIGS_PREFIX,
    RUNS_PREFIX,
    TRAINING_DATA_PREFIX,
    TRAJECTORIES_PREFIX,
    trajectories_prefix,
)
from tests.conftest import Synthesized, as_list
from training_configs.schema import EVALUATION_DATA_PREFIX


def _data_bucket(app: Synthesized) -> tuple[str, dict]:
    buckets = app.resources("storage", "AWS::S3::Bucket")
    (logical_id,) = [key for key in buckets if key.startswith("StorageData")]
    return logical_id, buckets[logical_id]


def _policy_of(app: Synthesized, bucket_id: str) -> dict:
    (policy,) = [
        policy["Properties"]["PolicyDocument"]
        for policy in app.resources("storage", "AWS::S3::BucketPolicy").values()
        if policy["Properties"]["Bucket"] == {"Ref": bucket_id}
    ]
    return policy


def test_data_bucket_is_kms_encrypted_versioned_and_private(default_app: Synthesized) -> None:
    _, bucket = _data_bucket(default_app)
    properties = bucket["Properties"]
    (rule,) = properties["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert rule["ServerSideEncryptionByDefault"]["SSEAlgorithm"] == "aws:kms"
    key_id, _ = default_app.one("storage", "AWS::KMS::Key")
    assert rule["ServerSideEncryptionByDefault"]["KMSMasterKeyID"] == {
        "Fn::GetAtt": [key_id, "Arn"]
    }
    assert properties["VersioningConfiguration"] == {"Status": "Enabled"}
    assert properties["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }
    assert bucket["DeletionPolicy"] == "Retain"


def test_data_key_rotates(default_app: Synthesized) -> None:
    _, key = default_app.one("storage", "AWS::KMS::Key")
    assert key["Properties"]["EnableKeyRotation"] is True


def test_every_bucket_denies_plain_http(default_app: Synthesized) -> None:
    for bucket_id in default_app.resources("storage", "AWS::S3::Bucket"):
        statements = _policy_of(default_app, bucket_id)["Statement"]
        denies = [
            s
            for s in statements
            if s["Effect"] == "Deny"
            and s.get("Condition", {}).get("Bool") == {"aws:SecureTransport": "false"}
        ]
        assert denies, f"{bucket_id} accepts requests without TLS"


def test_data_bucket_sends_events_to_eventbridge(default_app: Synthesized) -> None:
    data_id, _ = _data_bucket(default_app)
    (notification,) = default_app.resources("storage", "Custom::S3BucketNotifications").values()
    assert notification["Properties"]["BucketName"] == {"Ref": data_id}
    assert notification["Properties"]["NotificationConfiguration"] == {
        "EventBridgeConfiguration": {}
    }


def test_data_bucket_access_is_logged(default_app: Synthesized) -> None:
    _, bucket = _data_bucket(default_app)
    logging = bucket["Properties"]["LoggingConfiguration"]
    (log_id,) = [
        key
        for key in default_app.resources("storage", "AWS::S3::Bucket")
        if key.startswith("StorageAccessLogs")
    ]
    assert logging["DestinationBucketName"] == {"Ref": log_id}


def test_old_run_artifacts_expire_after_the_configured_days(default_app: Synthesized) -> None:
    _, bucket = _data_bucket(default_app)
    rules = {rule["Id"]: rule for rule in bucket["Properties"]["LifecycleConfiguration"]["Rules"]}
    days = default_app.config.run_artifact_retention_days
    for rule, prefix in (("expire-old-run-artifacts", "runs/"),
                         ("expire-old-trajectories", "trajectories/")):  # fmt: skip
        assert (rules[rule]["Prefix"], rules[rule]["ExpirationInDays"]) == (prefix, days)
    assert rules["abort-incomplete-uploads"]["AbortIncompleteMultipartUpload"] == {
        "DaysAfterInitiation": 7
    }


def test_lifecycle_scripts_bucket_is_named_for_hyperpod(default_app: Synthesized) -> None:
    buckets = default_app.resources("storage", "AWS::S3::Bucket")
    (bucket,) = [b for key, b in buckets.items() if key.startswith("StorageLifecycleScripts")]
    name = json.dumps(bucket["Properties"]["BucketName"])
    assert '"sagemaker-nova-mtrl-lc-"' in name
    (deployment,) = default_app.resources("storage", "Custom::CDKBucketDeployment").values()
    assert deployment["Properties"]["DestinationBucketKeyPrefix"] == "hyperpod-lifecycle/"


def test_outputs_name_the_bucket_and_the_upload_command(default_app: Synthesized) -> None:
    outputs = default_app.template("storage")["Outputs"]
    data_id, _ = _data_bucket(default_app)
    assert outputs["DataBucketName"]["Value"] == {"Ref": data_id}
    command = json.dumps(outputs["UploadCommand"]["Value"])
    assert "aws s3 cp data.jsonl s3://" in command and "/training-data/" in command


def test_data_bucket_permissions_are_not_public(default_app: Synthesized) -> None:
    data_id, _ = _data_bucket(default_app)
    for statement in _policy_of(default_app, data_id)["Statement"]:
        if statement["Effect"] == "Allow":
            assert "*" not in as_list(statement["Principal"].get("AWS", []))


def test_workers_write_only_under_the_trajectories_prefix(default_app: Synthesized) -> None:
    """The reward workers (where users' environments run) may write only `trajectories/`, a
    prefix no other output lives under: nothing a trainer, an evaluation or a deployment reads
    back. The only principal of the app that reads it is the operator (`mtrl trajectories`)."""
    others = (RUNS_PREFIX, TRAINING_DATA_PREFIX, CONFIGS_PREFIX, EVALUATION_DATA_PREFIX)
    assert not any(p.startswith(TRAJECTORIES_PREFIX) or TRAJECTORIES_PREFIX.startswith(p)
                   for p in others)  # fmt: skip
    assert trajectories_prefix("wordle-0a1b2c3d4e") == "trajectories/wordle-0a1b2c3d4e/"
    pipeline = default_app.template("pipeline")
    s3_actions: dict[str, set[str]] = {}
    readers = set()
    for logical_id, resource in pipeline["Resources"].items():
        document = resource.get("Properties", {}).get("PolicyDocument")
        for statement in document["Statement"] if document else []:
            actions = {a for a in as_list(statement["Action"]) if a.startswith("s3:")}
            text = json.dumps(statement["Resource"])
            if actions and "TaskRolePolicy" in logical_id:
                s3_actions.setdefault(text, set()).update(actions)
            if actions & {"s3:GetObject", "s3:ListBucket"} and "trajectories/" in json.dumps(
                statement
            ):
                readers.add(resource["Type"])
    ((resource, actions),) = s3_actions.items()
    assert actions == {"s3:PutObject"} and resource.endswith('/trajectories/*"]]}')
    assert readers == {"AWS::IAM::ManagedPolicy"}  # the operator's
