"""A deployed run in the managed MLflow tracking server: MLflow's REST calls as MLflow defines
them, signed for `sagemaker-mlflow` and naming the server as AWS's plugin does, the run's files
in its artifact store (tests/mlflow_fake.py holds the server to both)."""

from __future__ import annotations

from collections.abc import Iterator

import boto3
import pytest
from botocore.credentials import ReadOnlyCredentials

from domain.tracking import EXPERIMENT, tracked_run
from lambdas.pipeline.experiment_tracking import MlflowServer, TrackingFailed, server_endpoint
from tests.mlflow_fake import FakeMlflowServer
from training_configs.schema import load_training_config

ARN = "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/nova-mtrl"
KEY, SECRET = "AKIDPIPELINE", "secret"
BUCKET = "data-bucket"
CONFIG = load_training_config("rft_multiturn_lora")


def record(run_id: str, *, succeeded: bool = True):
    lines = [{"step": step, "mean_reward": step / 10, "win_rate": 0.1} for step in (1, 2, 3)]
    return tracked_run(
        run_id=run_id, succeeded=succeeded, config=CONFIG, dataset="s3://b/training-data/x.jsonl",
        metrics=lines, evaluation={"final": {"pass_at_1": 0.5}},
        artifacts={"summary.json": b"{}", "evaluation.json": b'{"final": {}}'},
    )  # fmt: skip


@pytest.fixture
def server(aws: None) -> Iterator[FakeMlflowServer]:
    boto3.client("s3").create_bucket(Bucket=BUCKET)
    calls: list[tuple[str, str]] = []
    with FakeMlflowServer(
        ARN,
        secret_of={KEY: SECRET}.get,
        artifact_root=f"s3://{BUCKET}/mlflow",
        on_call=lambda key, action, _: calls.append((key, action)),
    ) as fake:
        fake.calls = calls  # type: ignore[attr-defined]
        yield fake


def client(fake: FakeMlflowServer, secret: str = SECRET) -> MlflowServer:
    return MlflowServer(
        ARN,
        credentials=lambda: ReadOnlyCredentials(KEY, secret, None),
        s3=boto3.client("s3"),
        endpoint=fake.url,
        clock=lambda: 1_800_000_000.0,
    )


def test_a_run_is_logged_whole_in_the_deployments_experiment(server: FakeMlflowServer) -> None:
    first = client(server).log(record("wordle-0a1b2c3d4e"))
    second = client(server).log(record("wordle-9f8e7d6c5b", succeeded=False))
    (experiment,) = server.experiments.values()
    assert experiment["name"] == EXPERIMENT  # created once, found the second time
    logged = server.runs[first]
    assert logged["info"]["run_name"] == "wordle-0a1b2c3d4e"
    assert (
        logged["info"]["status"] == "FINISHED" and server.runs[second]["info"]["status"] == "FAILED"
    )
    assert ("train/mean_reward", 0.3, 3, 0) in logged["metrics"]
    assert ("eval/final/pass_at_1", 0.5, 3, 0) in logged["metrics"]
    assert logged["params"]["max_steps"] == str(CONFIG.max_steps)
    assert logged["tags"]["config_hash"] == CONFIG.fingerprint
    # Its files where the server keeps the run's artifacts.
    prefix = f"mlflow/{experiment['experiment_id']}/{first}/artifacts/"
    listed = boto3.client("s3").list_objects_v2(Bucket=BUCKET, Prefix=prefix)["Contents"]
    assert sorted(item["Key"].removeprefix(prefix) for item in listed) == [
        "evaluation.json", "summary.json",
    ]  # fmt: skip
    actions = [action for _, action in server.calls]  # type: ignore[attr-defined]
    assert actions[:6] == [
        "GetExperimentByName", "CreateExperiment", "CreateRun", "LogBatch", "UpdateRun",
        "GetExperimentByName",
    ]  # fmt: skip
    assert {key for key, _ in server.calls} == {KEY}  # type: ignore[attr-defined]


def test_a_request_the_server_refuses_is_a_clear_failure(server: FakeMlflowServer) -> None:
    """A signature the server cannot verify (wrong secret) is refused, and says so."""
    with pytest.raises(TrackingFailed, match=r"MLflow experiments/get-by-name: HTTP 403"):
        client(server, secret="wrong").log(record("wordle-0a1b2c3d4e"))
    assert server.refused == ["signature does not match"] and server.runs == {}


def test_the_endpoint_is_the_regions_as_awss_plugin_builds_it() -> None:
    assert server_endpoint(ARN) == "https://us-east-1.experiments.sagemaker.aws"
