"""The storage stack: encrypted, versioned, SSL-only data bucket with EventBridge; log and script buckets."""

from __future__ import annotations

import json

from tests.conftest import Synthesized, as_list


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
    runs = rules["expire-old-run-artifacts"]
    assert runs["Prefix"] == "runs/"
    assert runs["ExpirationInDays"] == default_app.config.run_artifact_retention_days
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
