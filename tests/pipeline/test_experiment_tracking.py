"""A deployed run in the managed MLflow tracking server: MLflow's REST calls as MLflow's own
server takes them and keeps them (a real one, tests/mlflow_real.py, read back with MLflow's own
client), signed for `sagemaker-mlflow` and naming the server as AWS's plugin does (what only
the fake, tests/mlflow_fake.py, can check), the run's files in its artifact store."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit

import boto3
import pytest
from botocore.credentials import ReadOnlyCredentials

from domain.tracking import EXPERIMENT, MAX_METRICS, tracked_run
from lambdas.pipeline.experiment_tracking import MlflowServer, TrackingFailed, server_endpoint
from tests.mlflow_fake import FakeMlflowServer
from tests.mlflow_real import mlflow_server
from training_configs.schema import load_training_config

ARN = "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/nova-mtrl"
KEY, SECRET = "AKIDPIPELINE", "secret"
BUCKET = "data-bucket"
CONFIG = load_training_config("rft_multiturn_lora")


def record(run_id: str, *, succeeded: bool = True, lines: list[dict] | None = None):
    lines = lines or [
        {"step": step, "mean_reward": step / 10, "win_rate": 0.1} for step in (1, 2, 3)
    ]
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


@pytest.fixture(scope="module")
def mlflow_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """MLflow's own server (one for the module: it takes seconds to start), its artifact root
    where the managed server's is (`mlflow/` in the data bucket)."""
    with mlflow_server(
        tmp_path_factory.mktemp("mlflow"), artifact_root=f"s3://{BUCKET}/mlflow"
    ) as url:
        yield url


@pytest.fixture
def real_server(aws: None, mlflow_url: str) -> str:
    boto3.client("s3").create_bucket(Bucket=BUCKET)
    return mlflow_url


def client(fake: FakeMlflowServer | str, secret: str = SECRET) -> MlflowServer:
    return MlflowServer(
        ARN,
        credentials=lambda: ReadOnlyCredentials(KEY, secret, None),
        s3=boto3.client("s3"),
        endpoint=fake if isinstance(fake, str) else fake.url,
        clock=lambda: 1_800_000_000.0,
    )


def test_mlflows_own_server_keeps_each_run_as_it_was_logged(real_server: str) -> None:
    from mlflow.tracking import MlflowClient

    first = client(real_server).log(record("wordle-0a1b2c3d4e"))
    second = client(real_server).log(record("wordle-9f8e7d6c5b", succeeded=False))
    mlflow = MlflowClient(tracking_uri=real_server)
    experiment = mlflow.get_experiment_by_name(EXPERIMENT)  # created once, found the second time
    runs = {run.info.run_id: run for run in mlflow.search_runs([experiment.experiment_id])}
    assert {first, second} <= set(runs)
    logged = mlflow.get_run(first)
    assert logged.info.run_name == "wordle-0a1b2c3d4e"
    assert (logged.info.status, mlflow.get_run(second).info.status) == ("FINISHED", "FAILED")
    assert logged.info.start_time == 1_800_000_000_000 == logged.info.end_time
    history = mlflow.get_metric_history(first, "train/mean_reward")
    assert [(m.step, m.value) for m in history] == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert logged.data.metrics["eval/final/pass_at_1"] == 0.5
    assert logged.data.params == record("x").params
    assert logged.data.tags["config_hash"] == CONFIG.fingerprint
    # Its files where the server says the run's artifacts are.
    where = urlsplit(logged.info.artifact_uri)
    assert (where.scheme, where.netloc) == ("s3", BUCKET)
    prefix = f"{where.path.strip('/')}/"
    listed = boto3.client("s3").list_objects_v2(Bucket=BUCKET, Prefix=prefix)["Contents"]
    assert sorted(item["Key"].removeprefix(prefix) for item in listed) == [
        "evaluation.json", "summary.json",
    ]  # fmt: skip


def test_a_long_run_goes_in_requests_mlflows_own_server_accepts(real_server: str) -> None:
    """Over a thousand metrics, with every param and tag: MLflow's server takes at most 1,000
    metrics, params and tags together in one LogBatch (mlflow/utils/validation.py,
    `_validate_batch_log_limits`)."""
    from mlflow.tracking import MlflowClient

    lines = [{"step": step, **{f"m{i}": i + step / 1000 for i in range(8)}} for step in range(150)]
    run = record("wordle-0a1b2c3d4e", lines=lines)
    assert len(run.metrics) > MAX_METRICS
    mlflow_id = client(real_server).log(run)
    mlflow = MlflowClient(tracking_uri=real_server)
    assert len(mlflow.get_metric_history(mlflow_id, "train/m7")) == 150
    logged = mlflow.get_run(mlflow_id).data
    assert logged.params == run.params and set(run.tags) <= set(logged.tags)


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


def test_the_fake_refuses_an_oversized_batch_as_mlflows_own_server_does(
    server: FakeMlflowServer, real_server: str
) -> None:
    metric = {"key": "m", "value": 1.0, "timestamp": 0, "step": 0}
    answers = []
    for endpoint in (server, real_server):
        made = client(endpoint)
        experiment = made._call("POST", "experiments/create", {"name": "limits"})["experiment_id"]
        run_id = made._call("POST", "runs/create", {"experiment_id": experiment})["run"]["info"][
            "run_id"
        ]
        body = {"run_id": run_id, "metrics": [metric] * 1000, "params": [], "tags": []}
        made._call("POST", "runs/log-batch", body)  # at the limit: taken
        body["tags"] = [{"key": "t", "value": "v"}]
        with pytest.raises(TrackingFailed) as refused:
            made._call("POST", "runs/log-batch", body)
        answers.append(str(refused.value))
    fake, real = answers
    assert "HTTP 400" in fake and "at most 1000 metrics, params, and tags" in fake
    assert fake.partition('"message": ')[2][:80] == real.partition('"message": ')[2][:80]
