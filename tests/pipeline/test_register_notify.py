"""Registering a run (config from S3 metadata, budget check, duplicates) and notifying its end."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml

from domain.bucket import UnsafeKey, check_dataset_key
from domain.presets import PresetMismatch
from domain.run_state import TornDown
from domain.runs import RunStore, run_id_for
from lambdas.pipeline.checkpoints import CheckpointRefused
from lambdas.pipeline.notify import notify, summary
from lambdas.pipeline.register import BudgetExceeded, Registered, register_run
from stacks.config import PlatformConfig, deployment_context
from tests.aws import create_runs_table
from training_configs.schema import TrainingConfigError

BUCKET = "data-bucket"
DATA = b'{"id": "a", "metadata": {"prompt": "p"}}\n'


def _lora() -> dict:
    return yaml.safe_load(
        Path(__file__)
        .resolve()
        .parents[2]
        .joinpath("training_configs", "rft_multiturn_lora.yaml")
        .read_text()
    )


@pytest.fixture
def s3_and_runs(aws: None) -> tuple:
    s3, db = boto3.client("s3"), boto3.client("dynamodb")
    s3.create_bucket(Bucket=BUCKET)
    s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    create_runs_table(db, "runs")
    return s3, RunStore(db, "runs")


def _upload(s3, key: str = "training-data/w.jsonl", metadata: dict | None = None) -> str:
    return s3.put_object(Bucket=BUCKET, Key=key, Body=DATA, Metadata=metadata or {})["VersionId"]


def test_default_config_registers_once_per_upload(s3_and_runs) -> None:
    s3, runs = s3_and_runs
    version = _upload(s3)
    first = register_run(
        s3,
        runs,
        bucket=BUCKET,
        key="training-data/w.jsonl",
        version_id=version,
        default_config="rft_multiturn_lora",
        now=1000.0,
    )
    assert first.created and first.run.config_name == "rft_multiturn_lora"
    assert first.run.deadline_at == 1000.0 + 12 * 3600 and first.run.cost_per_hour == pytest.approx(
        first.cost.per_hour
    )
    duplicate = register_run(
        s3,
        runs,
        bucket=BUCKET,
        key="training-data/w.jsonl",
        version_id=version,
        default_config="rft_multiturn_lora",
        now=2000.0,
    )
    assert (
        not duplicate.created
        and duplicate.run.run_id == first.run.run_id
        and duplicate.run.created_at == 1000.0
    )
    newer = register_run(
        s3,
        runs,
        bucket=BUCKET,
        key="training-data/w.jsonl",
        version_id=_upload(s3),
        default_config="rft_multiturn_lora",
        now=3000.0,
    )
    assert newer.created and newer.run.run_id != first.run.run_id


def _register_with(s3: object, runs: object, config: str, **planes: Any) -> Registered:
    """Register an upload whose metadata names `config` (`planes`: what the deployment has)."""
    version = _upload(s3, metadata={"mtrl-config": config})
    return register_run(
        s3,
        runs,
        bucket=BUCKET,
        key="training-data/w.jsonl",
        version_id=version,
        default_config="rft_multiturn_lora",
        now=0.0,
        **planes,
    )


def test_config_named_in_object_metadata(s3_and_runs) -> None:
    s3, runs = s3_and_runs
    registered = _register_with(s3, runs, "rft_multiturn_full")
    assert registered.run.config_name == "rft_multiturn_full" and registered.config.lora is None


def test_uploaded_config_file_and_its_errors(s3_and_runs) -> None:
    s3, runs = s3_and_runs
    mine = yaml.safe_dump(
        {
            **_lora(),
            "name": "mine",
            "max_steps": 5,
        }
    )
    s3.put_object(Bucket=BUCKET, Key="configs/mine.yaml", Body=mine.encode())
    registered = _register_with(s3, runs, "configs/mine.yaml")
    assert registered.config.name == "mine" and registered.config.max_steps == 5
    # Missing: found out by listing configs/ (a GetObject would answer 403 on AWS, not 404).
    s3.put_object(Bucket=BUCKET, Key="configs/missing.yaml.bak", Body=mine.encode())
    with pytest.raises(TrainingConfigError, match="configs/missing.yaml: no such object"):
        _register_with(s3, runs, "configs/missing.yaml")
    # Anywhere else in the bucket: the pipeline may not read it, and says where configs go.
    s3.put_object(Bucket=BUCKET, Key="elsewhere/mine.yaml", Body=mine.encode())
    with pytest.raises(
        TrainingConfigError, match=r"nor under s3://data-bucket/configs/: upload it there"
    ):
        _register_with(s3, runs, "elsewhere/mine.yaml")
    s3.put_object(Bucket=BUCKET, Key="configs/bad.yaml", Body=b"name: x\nrecipe: SFT\n")
    with pytest.raises(TrainingConfigError, match=r"config s3://data-bucket/configs/bad.yaml: "):
        _register_with(s3, runs, "configs/bad.yaml")


def test_over_budget_is_refused_before_anything_exists(s3_and_runs) -> None:
    s3, runs = s3_and_runs
    cheap = yaml.safe_dump({**_lora(), "budget_usd": 100})
    s3.put_object(Bucket=BUCKET, Key="configs/cheap.yaml", Body=cheap.encode())
    with pytest.raises(BudgetExceeded, match=r"OVER the \$100 budget; raise budget_usd"):
        _register_with(s3, runs, "configs/cheap.yaml")
    assert boto3.client("dynamodb").scan(TableName="runs")["Count"] == 0


def test_a_config_the_cluster_cannot_run_is_refused_before_anything_exists(s3_and_runs) -> None:
    """Each model on its plane: a Nova model on the restricted group, as AWS's recipe takes it;
    an open-weights model on the standard group, with its preset."""
    s3, runs = s3_and_runs
    presets = PlatformConfig.from_context(deployment_context()).model_presets
    qwen = {**_lora(), "model": "qwen3-8b", "instance_count": 1}
    configs = {
        "kl": {**_lora(), "kl_coefficient": 0.01},
        "nova-other": {**_lora(), "instance_type": "ml.g5.48xlarge"},
        "qwen": qwen,
        "qwen-wide": {**qwen, "instance_count": 4},
        "qwen-other": {**qwen, "instance_type": "ml.g5.48xlarge"},
    }
    for name, config in configs.items():
        s3.put_object(
            Bucket=BUCKET, Key=f"configs/{name}.yaml", Body=yaml.safe_dump(config).encode()
        )
    both = {"presets": presets, "instance_type": "ml.p5.48xlarge",
            "nova_instance_type": "ml.p5.48xlarge"}  # fmt: skip
    for config, planes, error in (
        ("configs/kl.yaml", both,
         r"config configs/kl.yaml cannot run as a Nova job \(`mtrl plan --config` shows the "
         r"job\): kl_coefficient: Nova's recipe has no KL term to set; set 0"),
        ("configs/nova-other.yaml", both,
         r"instance_type: ml.g5.48xlarge is not what this deployment's restricted instance "
         r"group runs \(ml.p5.48xlarge\)"),
        ("rft_multiturn_lora", {**both, "nova_instance_type": None},
         "model nova-lite-2 trains on a restricted instance group, and this deployment has "
         "none; add one to hyperpod_instance_groups"),
        ("configs/qwen-wide.yaml", both,
         "instance_count 4: the open-weights trainer runs on one node"),
        ("configs/qwen-other.yaml", both,
         r"instance_type: ml.g5.48xlarge is not what this deployment's training instance group "
         r"runs \(ml.p5.48xlarge\)"),
        ("rft_multiturn_lora", both, None),
        ("configs/qwen.yaml", {**both, "nova_instance_type": None}, None),
    ):  # fmt: skip
        version = _upload(s3, metadata={"mtrl-config": config})
        register = functools.partial(
            register_run, s3, runs, bucket=BUCKET, key="training-data/w.jsonl",
            version_id=version, default_config="rft_multiturn_lora", now=0.0, **planes,
        )  # fmt: skip
        if error is None:
            assert register().created
            boto3.client("dynamodb").delete_item(
                TableName="runs",
                Key={"run_id": {"S": run_id_for(BUCKET, "training-data/w.jsonl", version)}},
            )
            continue
        with pytest.raises((PresetMismatch, TrainingConfigError), match=error):
            register()
        assert boto3.client("dynamodb").scan(TableName="runs")["Count"] == 0


def test_failure_notification_names_state_error_and_leftovers(s3_and_runs) -> None:
    s3, runs = s3_and_runs
    sns, sqs = boto3.client("sns"), boto3.client("sqs")
    topic = sns.create_topic(Name="alerts")["TopicArn"]
    inbox = sqs.create_queue(QueueName="inbox")["QueueUrl"]
    inbox_arn = sqs.get_queue_attributes(QueueUrl=inbox, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    sns.subscribe(
        TopicArn=topic,
        Protocol="sqs",
        Endpoint=inbox_arn,
        Attributes={"RawMessageDelivery": "true"},
    )
    registered = register_run(
        s3,
        runs,
        bucket=BUCKET,
        key="training-data/w.jsonl",
        version_id=_upload(s3),
        default_config="rft_multiturn_lora",
        now=0.0,
    )
    notice = summary(
        registered.run,
        run_id=registered.run.run_id,
        succeeded=False,
        now=1800.0,
        failed_state="SubmitTrainingJob",
        error="ImagePullBackOff",
        teardown=TornDown(run_id=registered.run.run_id, queues_deleted=5, leftover=0),
    )
    notify(sns, topic, notice)
    (message,) = sqs.receive_message(QueueUrl=inbox)["Messages"]
    body = message["Body"]
    assert body.startswith(
        f"nova-mtrl run {registered.run.run_id} FAILED\nfailed in SubmitTrainingJob: ImagePullBackOff"
    )
    assert "teardown: 0 resources left" in body
    details = json.loads(body.split("\n\n", 1)[1])
    assert details["duration_hours"] == 0.5 and details["cost_estimate_usd"] == pytest.approx(
        0.5 * registered.run.cost_per_hour, abs=0.01
    )


def _summary_of(s3: object, run_id: str, *, model: str, checkpoints: list[dict]) -> None:
    """What Collect leaves of a finished run: its config's model and its checkpoints."""
    body = {"run_id": run_id, "config": {**_lora(), "model": model}, "checkpoints": checkpoints}
    s3.put_object(Bucket=BUCKET, Key=f"runs/{run_id}/summary.json", Body=json.dumps(body))


def _with_base(s3: object, runs: object, base: str) -> Registered:
    config = yaml.safe_dump({**_lora(), "name": "again", "base_checkpoint": base})
    s3.put_object(Bucket=BUCKET, Key="configs/again.yaml", Body=config.encode())
    return _register_with(s3, runs, "configs/again.yaml")


def test_a_run_starts_from_the_last_checkpoint_of_the_run_it_names(s3_and_runs) -> None:
    s3, runs = s3_and_runs
    manifest = f"s3://{BUCKET}/runs/first-1/checkpoints/manifest.json"
    _summary_of(s3, "first-1", model="nova-lite-2", checkpoints=[
        {"name": "final", "manifest": manifest, "uri": f"s3://{BUCKET}/final.npz", "step": 10},
        {"name": "step-000005", "manifest": manifest, "uri": f"s3://{BUCKET}/s5.npz", "step": 5},
        {"name": "lost", "manifest": manifest, "uri": None, "step": 20},
    ])  # fmt: skip
    registered = _with_base(s3, runs, "run:first-1")
    assert registered.base is not None
    assert (registered.base.uri, registered.base.run_id, registered.base.step) == (
        f"s3://{BUCKET}/final.npz", "first-1", 10,
    )  # fmt: skip
    # A Nova checkpoint (its step unknown) or any S3 URI: taken as it is.
    uri = _with_base(s3, runs, "s3://customer-escrow/job-abcde/checkpoint").base
    assert uri is not None and (uri.uri, uri.run_id) == (
        "s3://customer-escrow/job-abcde/checkpoint",
        None,
    )


@pytest.mark.parametrize(
    ("model", "checkpoints", "expected"),
    [
        (None, [], r"run first-1 left no results \(no s3://data-bucket/runs/first-1/summary.json\); "
                   r"start from a run that succeeded \(`mtrl runs`\), or give the checkpoint's S3 URI"),
        ("garbled", [], r"s3://data-bucket/runs/first-1/summary.json cannot be read"),
        ("qwen3-8b", [], r"run first-1 trained qwen3-8b, not this config's model nova-lite-2"),
        ("nova-lite-2", [{"name": "j", "manifest": "m", "uri": None}],
         r"run first-1 recorded no checkpoint with a location"),
    ],
)  # fmt: skip
def test_a_base_checkpoint_that_cannot_be_used_is_refused_before_the_run_exists(
    s3_and_runs, model: str | None, checkpoints: list, expected: str
) -> None:
    s3, runs = s3_and_runs
    if model == "garbled":
        s3.put_object(Bucket=BUCKET, Key="runs/first-1/summary.json", Body=b"{not json")
    elif model:
        _summary_of(s3, "first-1", model=model, checkpoints=checkpoints)
    with pytest.raises(
        CheckpointRefused,
        match=rf"config configs/again.yaml: base_checkpoint run:first-1: {expected}",
    ):
        _with_base(s3, runs, "run:first-1")
    assert runs.all() == []


def test_the_end_notification_lists_the_run_health_warnings(s3_and_runs) -> None:
    s3, runs = s3_and_runs
    registered = register_run(
        s3, runs, bucket=BUCKET, key="training-data/w.jsonl", version_id=_upload(s3),
        default_config="rft_multiturn_lora", now=0.0,
    )  # fmt: skip
    warning = "run health: 12% of the rollouts ended in an environment error on steps 1-3 (...)"
    run = runs.update(registered.run.run_id, now=1.0, health={"env_error_rate": warning})
    torn_down = TornDown(run_id=run.run_id, queues_deleted=5, leftover=0)
    notice = summary(run, run_id=run.run_id, succeeded=True, now=1800.0, teardown=torn_down)
    assert notice.health == [warning]
    sns = boto3.client("sns")
    topic = sns.create_topic(Name="alerts")["TopicArn"]
    published: list[dict] = []
    spy = type(
        "Sns",
        (),
        {"publish": lambda _self, **kwargs: published.append(kwargs) or {"MessageId": "m"}},
    )()
    notify(spy, topic, notice)
    assert f"warning: {warning}" in published[0]["Message"].split("\n\n", 1)[0]


def test_a_dataset_key_outside_s3s_safe_characters_is_refused_before_the_run_exists(
    s3_and_runs,
) -> None:
    """The key reaches a Nova recipe's data_s3_path as it is, which Hydra/OmegaConf resolves
    (`${oc.env:...}` would read the launcher's environment)."""
    s3, runs = s3_and_runs
    key = "training-data/${oc.env:AWS_SECRET_ACCESS_KEY}.jsonl"
    with pytest.raises(UnsafeKey) as refused:
        register_run(
            s3, runs, bucket=BUCKET, key=key, version_id=_upload(s3, key),
            default_config="rft_multiturn_lora", now=0.0,
        )  # fmt: skip
    assert str(refused.value) == (
        f"dataset key {key!r} has characters outside S3's safe set ('$' ':' '{{' '}}'): rename "
        "the file with letters, digits and ! - _ . * ' ( ) only"
    )
    assert runs.all() == []
    for safe in ("training-data/team-a/wordle_v2.(final)!.jsonl", "training-data/a*b'c.jsonl"):
        check_dataset_key(safe)
    for unsafe in (
        "training-data/my data.jsonl",
        "training-data/x#1.jsonl",
        "training-data/é.jsonl",
    ):
        with pytest.raises(UnsafeKey):
            check_dataset_key(unsafe)


def test_a_serverless_run_needs_the_plane_and_a_config_the_managed_job_takes(s3_and_runs) -> None:
    s3, runs = s3_and_runs
    example = Path(__file__).resolve().parents[2] / "examples" / "wordle" / "serverless.yaml"
    config = yaml.safe_load(example.read_text(encoding="utf-8"))
    for name, body in (("serverless", config), ("kl", {**config, "kl_coefficient": 0.1})):
        s3.put_object(Bucket=BUCKET, Key=f"configs/{name}.yaml", Body=yaml.safe_dump(body).encode())
    with pytest.raises(TrainingConfigError, match=r"plane: serverless runs as SageMaker's "
                       r"managed job, and this deployment has no serverless plane"):  # fmt: skip
        _register_with(s3, runs, "configs/serverless.yaml")
    with pytest.raises(TrainingConfigError, match=r"cannot run as SageMaker's managed job .*: "
                       r"kl_coefficient: the managed job's recipe has no KL term; set 0"):  # fmt: skip
        _register_with(s3, runs, "configs/kl.yaml", serverless_plane=True)
    assert boto3.client("dynamodb").scan(TableName="runs")["Count"] == 0
    registered = _register_with(s3, runs, "configs/serverless.yaml", serverless_plane=True)
    assert registered.created and registered.config.plane == "serverless"
    assert registered.cost.gpu_per_hour == 0.0 and registered.cost.token_charge_excluded
