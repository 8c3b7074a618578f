"""`mtrl submit / runs / status / cost` against moto: the deployment found from its stack
outputs, what each command sends and prints, and the one-line failures (missing stacks, a
wrong region, no credentials, an unknown run, bad input)."""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.core.config import default_user_config
from typer.testing import CliRunner

from domain.nova_job import submitted_recipe_key
from domain.run_queues import QueueKind, create_run_queues, queue_name
from domain.runs import RunRecord, RunStore, run_id_for
from lambdas.clients import Clients
from lambdas.pipeline.composition import compose
from lambdas.pipeline.dependencies import Compute
from lambdas.router.conversations import create_table
from mtrl import console
from mtrl.cli import app
from mtrl.commands import aws
from mtrl.ops.deployment import find_deployment
from mtrl.ops.logs import follow, sources
from mtrl.ops.runs_view import run_status
from tests.aws import create_runs_table
from tests.pipeline.test_handlers import RecordingCompute
from tests.service_fakes import FakeSageMaker, ServiceFake

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "wordle"
BUCKET = "nova-mtrl-data-123456789012"
runner = CliRunner()


def _stack(name: str, outputs: dict[str, str]) -> None:
    template = {
        "Resources": {"Marker": {"Type": "AWS::SNS::Topic", "Properties": {"TopicName": name}}},
        "Outputs": {key: {"Value": value} for key, value in outputs.items()},
    }
    boto3.client("cloudformation").create_stack(StackName=name, TemplateBody=json.dumps(template))


@pytest.fixture
def deployed(aws: None, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The three stacks' outputs and what they name, in moto (us-east-1)."""
    # moto runs executions for real (the one Wait state), so their history names the state.
    monkeypatch.setitem(default_user_config, "stepfunctions", {"execute_state_machine": True})
    s3, db, sfn = boto3.client("s3"), boto3.client("dynamodb"), boto3.client("stepfunctions")
    s3.create_bucket(Bucket=BUCKET)
    s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    create_runs_table(db, "nova-mtrl-runs")
    machine = sfn.create_state_machine(
        name="nova-mtrl-pipeline",
        definition=json.dumps({"StartAt": "Monitor", "States": {"Monitor": {"Type": "Wait", "Seconds": 3600, "End": True}}}),
        roleArn="arn:aws:iam::123456789012:role/pipeline",
    )["stateMachineArn"]  # fmt: skip
    _stack("nova-mtrl-storage", {"DataBucketName": BUCKET})
    _stack("nova-mtrl-pipeline", _pipeline_outputs(machine))
    _stack("nova-mtrl-compute", {"RewardWorkerClusterName": "nova-mtrl-reward-workers",
                                 "HyperPodClusterName": "nova-mtrl-hyperpod", "EksClusterName": "nova-mtrl-eks",
                                 "HyperPodTrainingGroupName": "gpu"})  # fmt: skip
    return {"s3": s3, "db": db, "sfn": sfn, "machine": machine}


def _pipeline_outputs(machine: str, **more: str) -> dict[str, str]:
    return {
        "StateMachineArn": machine,
        "RunsTableName": "nova-mtrl-runs",
        "PipelineLogGroups": "/aws/vendedlogs/states/pipeline,/aws/lambda/register",
        "RewardWorkerLogGroupPrefix": "/nova-mtrl/reward-workers",
        **more,
    }


def _invoke(*args: str) -> Any:
    return runner.invoke(app, [*args, "--region", "us-east-1"])


def test_submit_uploads_config_then_dataset_and_names_the_run(deployed: dict) -> None:
    result = _invoke(
        "submit", str(EXAMPLE / "train.jsonl"), "--config", str(EXAMPLE / "config.yaml"), "--json"
    )
    assert result.exit_code == 0, result.output
    submitted = json.loads(result.output)
    s3 = deployed["s3"]
    head = s3.head_object(Bucket=BUCKET, Key="training-data/train.jsonl")
    assert submitted["run_id"] == run_id_for(BUCKET, "training-data/train.jsonl", head["VersionId"])
    config_key = head["Metadata"]["mtrl-config"]
    assert config_key.startswith("configs/config-") and config_key.endswith(".yaml")
    uploaded = s3.get_object(Bucket=BUCKET, Key=config_key)["Body"].read()
    assert uploaded == (EXAMPLE / "config.yaml").read_bytes()
    assert submitted["execution_arn"].endswith(
        f":execution:nova-mtrl-pipeline:{submitted['run_id']}"
    )
    assert submitted["console_url"].startswith("https://us-east-1.console.aws.amazon.com/states/")


def test_submit_with_a_shipped_config_names_it_and_uploads_no_file(deployed: dict) -> None:
    result = _invoke(
        "submit",
        str(EXAMPLE / "train.jsonl"),
        "--config",
        "rft_multiturn_full",
        "--name",
        "w.jsonl",
    )
    assert result.exit_code == 0, result.output
    assert "mtrl status" in result.output and "within the $30,000 budget" in result.output
    head = deployed["s3"].head_object(Bucket=BUCKET, Key="training-data/w.jsonl")
    assert head["Metadata"]["mtrl-config"] == "rft_multiturn_full"
    assert "Contents" not in deployed["s3"].list_objects_v2(Bucket=BUCKET, Prefix="configs/")


def test_submit_refuses_bad_input_before_any_upload(deployed: dict, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "metadata": {"prompt": "p"}}\n{broken\n')
    result = _invoke("submit", str(bad))
    assert result.exit_code == 1
    assert "line 2" in result.output and "1 problem; nothing was uploaded" in result.output
    config = tmp_path / "c.yaml"
    config.write_text("name: x\n")
    result = _invoke("submit", str(EXAMPLE / "train.jsonl"), "--config", str(config))
    assert result.exit_code == 2 and f"config {config}:" in result.output
    over = tmp_path / "over.yaml"
    over.write_text(
        (EXAMPLE / "config.yaml").read_text().replace("budget_usd: 1000", "budget_usd: 5")
    )
    result = _invoke("submit", str(EXAMPLE / "train.jsonl"), "--config", str(over))
    assert result.exit_code == 2 and "OVER the $5 budget" in result.output
    kl = tmp_path / "kl.yaml"
    kl.write_text(
        (EXAMPLE / "config.yaml").read_text().replace("kl_coefficient: 0.0", "kl_coefficient: 0.1")
    )
    result = _invoke("submit", str(EXAMPLE / "train.jsonl"), "--config", str(kl))
    assert result.exit_code == 2
    assert f"config {kl} cannot run as a Nova job (`mtrl plan --config {kl}` shows" in result.output
    assert "kl_coefficient: Nova's recipe has no KL term to set; set 0" in result.output
    result = _invoke("submit", str(EXAMPLE / "train.jsonl"), "--name", "notes.txt")
    assert (
        result.exit_code == 2
        and "training-data/notes.txt: the pipeline starts only for .jsonl" in result.output
    )
    assert "Contents" not in deployed["s3"].list_objects_v2(Bucket=BUCKET)
    assert "Traceback" not in result.output
    # A key S3 calls unsafe (here an OmegaConf interpolation a Nova recipe would resolve), with
    # a config file: refused before the config is uploaded too.
    result = _invoke(
        "submit", str(EXAMPLE / "train.jsonl"), "--config", str(EXAMPLE / "config.yaml"),
        "--name", "${oc.env:HOME}.jsonl",
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    flat = " ".join(result.output.split())
    assert (
        "dataset key 'training-data/${oc.env:HOME}.jsonl' has characters outside S3's safe" in flat
    )
    assert "('$' ':' '{' '}'): rename the file" in flat and "(or give --name)" in flat
    assert "Contents" not in deployed["s3"].list_objects_v2(Bucket=BUCKET)


@pytest.mark.parametrize(
    "command",
    [
        ["runs"],
        ["status", "r"],
        ["logs", "r"],
        ["cost", "r"],
        ["teardown", "r"],
        ["submit", str(EXAMPLE / "train.jsonl")],
    ],  # fmt: skip
)
def test_every_command_names_the_missing_stack(aws: None, command: list[str]) -> None:
    result = _invoke(*command)
    assert result.exit_code == 2
    assert (
        result.output.strip()
        .splitlines()[-1]
        .startswith("error: stack nova-mtrl-storage not found in us-east-1")
    )
    assert "Traceback" not in result.output


def test_missing_stacks_and_a_wrong_region_are_one_line(aws: None) -> None:
    result = _invoke("runs")
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: stack nova-mtrl-storage not found in us-east-1: deploy with `make deploy`, or "
        "pass the --region (and --prefix) it was deployed with"
    ]
    _stack("nova-mtrl-storage", {"DataBucketName": BUCKET})
    result = runner.invoke(app, ["runs", "--region", "eu-west-1"])
    assert (
        result.exit_code == 2 and "stack nova-mtrl-storage not found in eu-west-1" in result.output
    )


def test_every_missing_prerequisite_is_named_at_once(no_aws_setup: None) -> None:
    result = runner.invoke(app, ["runs"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: no AWS region: pass --region, set AWS_REGION, or configure one for the profile",
        "error: no AWS credentials: run `aws configure` (or `aws sso login`), or pass --profile",
    ]
    result = runner.invoke(app, ["runs", "--region", "us-east-1"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: no AWS credentials: run `aws configure` (or `aws sso login`), or pass --profile"
    ]
    result = runner.invoke(app, ["runs", "--region", "us-east-1", "--profile", "nope"])
    assert result.exit_code == 2 and "AWS profile 'nope' is not configured" in result.output


def _register(
    db: Any, run_id: str, *, created: float, status: str = "active", evaluation: str | None = None
) -> None:
    RunStore(db, "nova-mtrl-runs").register(RunRecord(
        run_id=run_id, bucket=BUCKET, key=f"training-data/{run_id}.jsonl", config_name="rft_multiturn_lora",
        status=status, created_at=created, updated_at=created + 1800, deadline_at=created + 12 * 3600,
        cost_per_hour=394.0, evaluation=evaluation,
    ))  # fmt: skip


HEADLINE = "pass@1 0.31 → 0.58 (+0.27, 95% CI +0.12..+0.41; 256 held-out rollouts)"


def test_runs_lists_newest_first_with_cost_so_far(
    deployed: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = time.time()
    _register(
        deployed["db"], "older-1", created=now - 7200, status="succeeded", evaluation=HEADLINE
    )
    _register(deployed["db"], "newer-2", created=now - 3600)
    result = _invoke("runs", "--json")
    assert result.exit_code == 0, result.output
    runs = json.loads(result.output)
    assert [r["run_id"] for r in runs] == ["newer-2", "older-1"]
    assert runs[0]["spent_usd"] == pytest.approx(394.0, rel=0.01)  # one hour, still running
    assert runs[1]["spent_usd"] == pytest.approx(197.0) and runs[1]["deadline_in_hours"] is None
    assert (runs[0]["evaluation"], runs[1]["evaluation"]) == (None, HEADLINE)
    monkeypatch.setattr(console.out, "_width", 250)  # the tables whole, unwrapped
    table = _invoke("runs")
    assert "newer-2" in table.output and "$394/h" in table.output and HEADLINE in table.output
    status = _invoke("status", "older-1")
    assert re.search(rf"held-out evaluation\W+{re.escape(HEADLINE)}", status.output), status.output


def test_status_gathers_execution_training_queues_and_cost(deployed: dict) -> None:
    _register(deployed["db"], "wordle-abc", created=time.time() - 600)
    deployed["sfn"].start_execution(
        stateMachineArn=deployed["machine"], name="wordle-abc", input="{}"
    )
    create_run_queues(boto3.client("sqs"), prefix="nova-mtrl", run_id="wordle-abc")
    boto3.client("cloudwatch").put_metric_data(Namespace="AWS/SQS", MetricData=[{
        "MetricName": "ApproximateAgeOfOldestMessage", "Value": 42.0, "Timestamp": time.time() - 60,
        "Dimensions": [{"Name": "QueueName", "Value": queue_name("nova-mtrl", "wordle-abc", QueueKind.ROLLOUT_REQUESTS)}],
    }])  # fmt: skip
    metrics = "".join(json.dumps({"step": s, "mean_reward": 0.1 * s}) + "\n" for s in (1, 2, 3))
    deployed["s3"].put_object(Bucket=BUCKET, Key="runs/wordle-abc/metrics.jsonl", Body=metrics)
    result = _invoke("status", "wordle-abc", "--json")
    assert result.exit_code == 0, result.output
    status = json.loads(result.output)
    assert (status["execution"], status["state"]) == ("RUNNING", "Monitor")
    assert status["step"] == 3 and status["mean_reward"] == pytest.approx(0.3)
    assert [q["kind"] for q in status["queues"]] == [
        "rollout-requests", "rollout-responses", "generate-requests", "generate-responses", "dlq",
    ]  # fmt: skip
    ages = {q["kind"]: q["oldest_seconds"] for q in status["queues"]}
    assert ages["rollout-requests"] == 42.0 and ages["dlq"] is None  # no data: no age
    assert status["workers"] is None  # no fleet (yet): shown as absent, not an error
    assert status["pass_rate"] is None and status["checkpoints"] == []  # not said; not ended
    table = _invoke("status", "wordle-abc")
    assert "step 3, mean reward 0.300" in table.output and "RUNNING in Monitor" in table.output
    assert "rollout-requests: 0 waiting, 0 in flight, oldest 42s" in table.output
    assert "pass rate" not in table.output and "checkpoints" not in table.output


def test_status_shows_the_pass_rate_and_the_checkpoints_collect_found(deployed: dict) -> None:
    """A Nova run's curve line (from its rollout reports) says its pass rate; once the run ended,
    its summary says where its checkpoints are (a manifest without a location says so)."""
    _register(deployed["db"], "nova-abc", created=time.time() - 600)
    line = {"step": 2, "mean_reward": 0.5, "pass_rate": 0.375, "source": "rollout_reports"}
    deployed["s3"].put_object(
        Bucket=BUCKET, Key="runs/nova-abc/metrics.jsonl", Body=json.dumps(line) + "\n"
    )
    manifest = "s3://nova-mtrl-data-123456789012/runs/nova-abc/{}/manifest.json"
    checkpoints = [
        {"name": "j-abcde", "manifest": manifest.format("j-abcde"), "uri": "s3://escrow/j"},
        {"name": "j-fghij", "manifest": manifest.format("j-fghij"), "uri": None},
        {
            "name": "final",
            "manifest": manifest.format("checkpoints"),
            "uri": "s3://b/final.npz",
            "step": 12,
        },
    ]
    deployed["s3"].put_object(
        Bucket=BUCKET, Key="runs/nova-abc/summary.json",
        Body=json.dumps({"run_id": "nova-abc", "checkpoints": checkpoints}),
    )  # fmt: skip
    status = json.loads(_invoke("status", "nova-abc", "--json").output)
    assert (status["pass_rate"], status["checkpoints"]) == (0.375, checkpoints)
    table = _invoke("status", "nova-abc").output
    assert "step 2, mean reward 0.500, pass rate 38%" in table
    assert "j-abcde: s3://escrow/j" in table
    assert "j-fghij: location unknown, see" in table
    assert "final (step 12): s3://b/final.npz" in table


def test_status_counts_the_gpu_nodes_hyperpod_runs(deployed: dict) -> None:
    _register(deployed["db"], "r", created=0.0)
    deployment = find_deployment(boto3.Session(region_name="us-east-1"), "nova-mtrl")
    sagemaker = FakeSageMaker(name="nova-mtrl-hyperpod")
    sagemaker.groups[1]["TargetCount"] = 4
    clients = {
        name: boto3.client(name)
        for name in ("dynamodb", "stepfunctions", "s3", "sqs", "cloudwatch", "ecs")
    }
    status = run_status({**clients, "sagemaker": sagemaker.client()}, deployment, "r", now=60.0)
    # The 4 running nodes of the training group: not the system group's, not the pending one.
    assert status.gpu_nodes == 4
    assert status.execution is None and status.queues == []


def test_an_unknown_run_is_one_line(deployed: dict) -> None:
    for command in (["status", "nope"], ["cost", "nope"]):
        result = _invoke(*command)
        assert result.exit_code == 1
        assert result.output.strip() == (
            "error: no run nope in deployment nova-mtrl"
            + (" (us-east-1)" if command[0] == "status" else "")
            + ": `mtrl runs` lists them"
        )


def test_cost_of_a_config_offline_and_of_a_run_so_far(deployed: dict) -> None:
    result = runner.invoke(app, ["cost", "--config", "rft_multiturn_lora", "--json"])
    estimate = json.loads(result.output)
    assert result.exit_code == 0 and estimate["within_budget"] and estimate["per_hour"] > 390
    _register(deployed["db"], "done-1", created=0.0, status="succeeded")
    result = _invoke("cost", "done-1")
    assert (
        result.exit_code == 0
        and result.output.strip() == "run done-1: $197 so far over 0h30m at $394/h"
    )


class InProcessReaper(ServiceFake):
    """The deployment's reaper Lambda, invoked in-process with the pipeline's settings (moto runs
    no Lambda code); `requests` are what the CLI sent."""

    service = "lambda"

    def __init__(self, reap: Callable[[dict], dict]) -> None:
        super().__init__()
        self.reap = reap

    @property
    def payloads(self) -> list[dict]:
        return [json.loads(params["Payload"]) for params in self.operations("Invoke")]

    def invoke(self, **request: Any) -> dict:
        assert request["FunctionName"] == "nova-mtrl-reaper"
        assert request["InvocationType"] == "RequestResponse"
        result = self.reap(json.loads(request["Payload"]))
        return {"StatusCode": 200, "Payload": json.dumps(result).encode()}


@pytest.fixture
def reaper(deployed: dict, monkeypatch: pytest.MonkeyPatch) -> InProcessReaper:
    outputs = _pipeline_outputs(deployed["machine"], ReaperFunctionName="nova-mtrl-reaper")
    template = {
        "Resources": {"Marker": {"Type": "AWS::SNS::Topic", "Properties": {"TopicName": "p"}}},
        "Outputs": {key: {"Value": value} for key, value in outputs.items()},
    }
    boto3.client("cloudformation").update_stack(
        StackName="nova-mtrl-pipeline", TemplateBody=json.dumps(template)
    )
    create_table(boto3.client("dynamodb"), "nova-mtrl-conversations")
    role = boto3.client("iam").create_role(RoleName="consumer", AssumeRolePolicyDocument="{}")
    boto3.client("lambda").create_function(
        FunctionName="consumer", Runtime="python3.12", Role=role["Role"]["Arn"],
        Handler="lambdas.router.consumer.handler", Code={"ZipFile": b"code"},
    )  # fmt: skip
    compute = RecordingCompute()
    environment = {
        "NAME_PREFIX": "nova-mtrl", "RUNS_TABLE": "nova-mtrl-runs",
        "CONVERSATIONS_TABLE": "nova-mtrl-conversations", "CONSUMER_FUNCTION": "consumer",
        "ROLLOUT_LAMBDA_ARN": "arn:aws:lambda:us-east-1:123456789012:function:rollout-forwarder",
        "STATE_MACHINE_ARN": deployed["machine"],
    }  # fmt: skip
    steps = compose(
        environment,
        Clients(boto3.Session()),
        compute=Compute(fleet=lambda: compute, cluster=lambda: compute),
    )
    fake = InProcessReaper(steps["reap"])

    class Session(boto3.Session):  # what the CLI gets: the reaper in-process, AWS from moto
        def client(self, name: str, *args: Any, **kwargs: Any) -> Any:
            return fake.client() if name == "lambda" else super().client(name, *args, **kwargs)

    monkeypatch.setattr(aws, "aws_session", lambda *, profile, region: Session(region_name=region))
    return fake


def test_teardown_stops_a_run_and_reports_what_it_removed(
    deployed: dict, reaper: InProcessReaper
) -> None:
    _register(deployed["db"], "live-1", created=time.time())
    deployed["sfn"].start_execution(stateMachineArn=deployed["machine"], name="live-1", input="{}")
    create_run_queues(boto3.client("sqs"), prefix="nova-mtrl", run_id="live-1")
    result = _invoke("teardown", "live-1")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == (
        "run live-1 torn down: 2 workers stopped, 7 job objects deleted, 5 queues deleted, 0 left"
    )
    assert reaper.payloads == [{"run_id": "live-1"}]
    status = json.loads(_invoke("status", "live-1", "--json").output)
    assert status["execution"] == "ABORTED" and status["summary"]["status"] == "failed"
    again = _invoke("teardown", "live-1")
    assert again.exit_code == 0 and "0 queues deleted, 0 left" in again.output
    unknown = _invoke("teardown", "nope")
    assert unknown.exit_code == 1
    assert (
        unknown.output.strip()
        == "error: no run nope in deployment nova-mtrl: `mtrl runs` lists them"
    )


def test_teardown_all_idle_and_its_usage(deployed: dict, reaper: InProcessReaper) -> None:
    result = _invoke("teardown", "--all-idle")
    assert result.exit_code == 0 and result.output.strip() == "idle GPU nodes scaled to zero"
    assert reaper.payloads == [{"release_idle": True}]
    for args in (["teardown"], ["teardown", "x", "--all-idle"]):
        result = _invoke(*args)
        assert result.exit_code == 2 and "give a run id" in result.output


def _log(group: str, *lines: tuple[int, str]) -> None:
    logs = boto3.client("logs")
    with contextlib.suppress(logs.exceptions.ResourceAlreadyExistsException):
        logs.create_log_group(logGroupName=group)
    stream = f"s{len(logs.describe_log_streams(logGroupName=group)['logStreams'])}"
    logs.create_log_stream(logGroupName=group, logStreamName=stream)
    logs.put_log_events(
        logGroupName=group,
        logStreamName=stream,
        logEvents=[{"timestamp": ts, "message": message} for ts, message in lines],
    )


def test_logs_of_the_pipeline_are_the_runs_lines_of_every_group_in_time_order(
    deployed: dict,
) -> None:
    now = int(time.time() * 1000)
    _log(
        "/aws/vendedlogs/states/pipeline",
        (now - 3000, "ExecutionStarted run-7"),
        (now - 1000, "TaskSucceeded run-7"),
    )
    _log(
        "/aws/lambda/register",
        (now - 2000, "registered run-7 with rft_multiturn_lora"),
        (now - 1500, "registered run-8"),
    )
    result = _invoke("logs", "run-7")
    assert result.exit_code == 0, result.output
    messages = [line.split(" ", 2)[2] for line in result.output.strip().splitlines()]
    assert messages == [
        "ExecutionStarted run-7", "registered run-7 with rft_multiturn_lora", "TaskSucceeded run-7",
    ]  # fmt: skip


def test_logs_of_the_workers_are_their_own_group_and_none_yet_is_fine(deployed: dict) -> None:
    assert _invoke("logs", "run-7", "--plane", "workers").output == ""
    now = int(time.time() * 1000)
    _log("/nova-mtrl/reward-workers/run-7", (now, "worker 1 up"), (now + 1, "rollout 3 reward 1.0"))
    result = _invoke("logs", "run-7", "--plane", "workers")
    assert [line.split(" ", 2)[2] for line in result.output.splitlines()] == [
        "worker 1 up", "rollout 3 reward 1.0",
    ]  # fmt: skip


def test_logs_of_the_trainer_ask_container_insights_for_the_runs_namespace(deployed: dict) -> None:
    deployment = find_deployment(boto3.Session(region_name="us-east-1"), "nova-mtrl")
    (source,) = sources(deployment, "run-7", "trainer")
    assert source.group == "/aws/containerinsights/nova-mtrl-eks/application"
    assert source.pattern == '{ $.kubernetes.namespace_name = "nova-mtrl-run-run-7" }'


def test_follow_prints_each_new_line_once(deployed: dict) -> None:
    now = int(time.time() * 1000)
    group = "/nova-mtrl/reward-workers/run-9"
    _log(group, (now, "first"))
    wanted = sources(
        find_deployment(boto3.Session(region_name="us-east-1"), "nova-mtrl"), "run-9", "workers"
    )
    arrivals = iter([[(now + 5, "second")], [(now + 9, "third")]])
    lines = follow(
        boto3.client("logs"),
        wanted,
        since_ms=now - 1,
        sleep=lambda _: _log(group, *next(arrivals)),
        rounds=3,
    )
    assert [line.message for line in lines] == ["first", "second", "third"]


def test_logs_refuses_an_unknown_plane_and_an_old_deployment(deployed: dict) -> None:
    result = _invoke("logs", "run-7", "--plane", "gpu")
    assert (
        result.exit_code == 2 and "--plane gpu: use pipeline, workers or trainer" in result.output
    )
    boto3.client("cloudformation").update_stack(
        StackName="nova-mtrl-pipeline",
        TemplateBody=json.dumps({
            "Resources": {"Marker": {"Type": "AWS::SNS::Topic", "Properties": {"TopicName": "p"}}},
            "Outputs": {"StateMachineArn": {"Value": deployed["machine"]}},
        }),
    )  # fmt: skip
    result = _invoke("logs", "run-7")
    assert result.exit_code == 2
    assert result.output.strip() == (
        "error: deployment nova-mtrl in us-east-1 has no output PipelineLogGroups: redeploy with "
        "this version (make deploy)"
    )


def test_status_shows_the_run_health_warnings_monitor_kept(deployed: dict) -> None:
    _register(deployed["db"], "sick-1", created=time.time() - 600)
    warning = "run health: 12% of the rollouts ended in an environment error on steps 1-3 (...)"
    RunStore(deployed["db"], "nova-mtrl-runs").update(
        "sick-1", now=time.time(), health={"env_error_rate": warning}
    )
    line = {"step": 3, "rollouts_asked": 8, "failed_rollouts": 1, "env_error_rollouts": 1,
            "timeout_rollouts": 0, "zero_variance_groups": 0.5, "turns_per_episode": 4.25,
            "grad_norm": 0.82, "entropy": None, "mismatch_kl": 0.0012}  # fmt: skip
    deployed["s3"].put_object(
        Bucket=BUCKET, Key="runs/sick-1/metrics.jsonl", Body=json.dumps(line).encode() + b"\n"
    )
    status = json.loads(_invoke("status", "sick-1", "--json").output)
    assert status["summary"]["health"] == [warning]
    assert status["health_figures"] == {
        "zero_variance_groups": 0.5, "failed_rollout_rate": 0.125, "env_error_rate": 0.125,
        "timeout_rate": 0.0, "mean_turns": 4.25, "sampler_mismatch": 0.0012,
    }  # fmt: skip
    table = _invoke("status", "sick-1").output
    assert "run health" in table and "run health: 12% of the rollouts" in table
    flat = " ".join(table.replace("│", " ").split())  # the cell's text, however it wrapped
    assert "last step zero variance groups 50%, failed rollout rate 12%, env error rate 12%" in flat
    assert "timeout rate 0%, mean turns 4.25" in flat
    # The open-weights trainer's update figures, those it wrote; its mismatch is a health figure.
    assert status["update"] == {"grad_norm": 0.82, "mismatch_kl": 0.0012}
    assert "last update grad norm 0.82, mismatch kl 0.0012" in flat
    assert "sampler mismatch 0.0012" in flat


def test_status_says_what_a_run_does_without_live_then_as_recorded(deployed: dict) -> None:
    """While a Nova run goes on, its recipes' skipped overrides (the records its plane keeps);
    once it ended, the notes NotifyEnd recorded."""
    _register(deployed["db"], "nova-def", created=time.time() - 600)
    record = {"job": "nova-def-t", "skipped": ["rollout_request_queue_url"], "recipe": {}}
    deployed["s3"].put_object(
        Bucket=BUCKET, Key=submitted_recipe_key("runs/nova-def/", "nova-def-t"),
        Body=json.dumps(record),
    )  # fmt: skip
    live = (
        "the recipe of job nova-def-t has no rollout_request_queue_url: skipped, as the Forge SDK "
        "skips an override its recipe lacks"
    )
    assert json.loads(_invoke("status", "nova-def", "--json").output)["notes"] == [live]
    flat = " ".join(_invoke("status", "nova-def").output.replace("│", " ").split())
    assert f"notes {live}" in flat
    recorded = [live, "final evaluation skipped: the training job recorded no checkpoint"]
    RunStore(deployed["db"], "nova-mtrl-runs").update(
        "nova-def", now=time.time(), status="succeeded", notes=recorded
    )
    assert json.loads(_invoke("status", "nova-def", "--json").output)["notes"] == recorded
