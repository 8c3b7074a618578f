"""The pipeline's Lambda handlers under moto: typed events in, results or typed errors out."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
from pydantic import ValidationError

from domain.backends import JobStatus, RewardFleet, RunContext, TrainingCluster
from domain.bucket import CONFIG_METADATA_KEY
from domain.episodes import EvaluationStage
from domain.runs import RunStore
from lambdas.clients import Clients
from lambdas.pipeline.composition import compose
from lambdas.pipeline.dependencies import Compute
from lambdas.pipeline.run_steps import DatasetInvalid, Upload
from lambdas.pipeline.settings import PipelineSettings
from lambdas.router.conversations import create_table
from mtrl.local.embedded import upload_event
from tests.aws import Recorded, create_router_functions, create_runs_table

BUCKET = "data"
GOOD = b'{"id": "a", "metadata": {"prompt": "p", "answer": "crane"}}\n'


def _event(key: str, version: str | None) -> dict:
    """An EventBridge S3 `Object Created` event, as the rule delivers it (local mode's)."""
    return upload_event(BUCKET, key, version)


def _consumer_mappings() -> list[dict]:
    return boto3.client("lambda").list_event_source_mappings(FunctionName="consumer")[
        "EventSourceMappings"
    ]


@pytest.fixture
def env(aws: None) -> dict:
    s3, db, sfn, sns = (boto3.client(name) for name in ("s3", "dynamodb", "stepfunctions", "sns"))
    s3.create_bucket(Bucket=BUCKET)
    s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    create_runs_table(db, "runs")
    create_table(db, "conversations")
    machine = sfn.create_state_machine(
        name="pipeline",
        definition=json.dumps(
            {"StartAt": "Wait", "States": {"Wait": {"Type": "Wait", "Seconds": 3600, "End": True}}}
        ),
        roleArn="arn:aws:iam::123456789012:role/pipeline",
    )["stateMachineArn"]
    environment = {
        "NAME_PREFIX": "nova-mtrl",
        "RUNS_TABLE": "runs",
        "CONVERSATIONS_TABLE": "conversations",
        **dict(
            zip(
                ("CONSUMER_FUNCTION", "ROLLOUT_LAMBDA_ARN"),
                create_router_functions(boto3.client("lambda"), boto3.client("iam")),
                strict=True,
            )
        ),
        "STATE_MACHINE_ARN": machine,
        "ALERT_TOPIC_ARN": sns.create_topic(Name="alerts")["TopicArn"],
    }
    clock, compute, clients = Clock(), RecordingCompute(), RecordedClients(boto3.Session())
    steps = compose(
        environment,
        clients,
        compute=Compute(fleet=lambda: compute, cluster=lambda: compute),
        clock=clock,
    )
    return {
        "s3": s3,
        "settings": PipelineSettings.from_environment(environment),
        "sfn": sfn,
        "steps": steps,
        "clock": clock,
        "compute": compute,
        "clients": clients,
    }


class RecordedClients(Clients):
    """The steps' clients, each keeping the requests made through it."""

    def __init__(self, session: boto3.Session) -> None:
        super().__init__(session)
        self.recorded: dict[str, Recorded] = {}

    def __call__(self, service: str, **options: str) -> Recorded:
        return self.recorded.setdefault(service, Recorded(super().__call__(service, **options)))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def call(env: dict, step: str, event: dict, *, now: float | None = None) -> dict:
    """Run a pipeline step as its function would, at `now` if given."""
    if now is not None:
        env["clock"].now = now
    return env["steps"][step](event)


def test_settings_come_from_the_environment() -> None:
    settings = PipelineSettings.from_environment(
        {
            "NAME_PREFIX": "p",
            "RUNS_TABLE": "r",
            "CONVERSATIONS_TABLE": "c",
            "CONSUMER_FUNCTION": "f",
            "ROLLOUT_LAMBDA_ARN": "arn:aws:lambda:us-east-1:123456789012:function:forwarder",
        }
    )
    assert (settings.name_prefix, settings.default_config) == ("p", "rft_multiturn_lora")


def test_an_upload_event_starts_one_execution_named_after_the_run(env: dict) -> None:
    version = env["s3"].put_object(Bucket=BUCKET, Key="training-data/w.jsonl", Body=GOOD)[
        "VersionId"
    ]
    first = call(env, "start_run", _event("training-data/w.jsonl", version))
    again = call(env, "start_run", _event("training-data/w.jsonl", version))
    assert first["execution_arn"] == again["execution_arn"] and first["execution_arn"].endswith(
        f":{first['run_id']}"
    )
    executions = env["sfn"].list_executions(stateMachineArn=env["settings"].state_machine_arn)[
        "executions"
    ]
    assert [e["name"] for e in executions] == [first["run_id"]]
    started = json.loads(
        env["sfn"].describe_execution(executionArn=first["execution_arn"])["input"]
    )
    assert Upload.model_validate(started) == Upload(
        bucket=BUCKET, key="training-data/w.jsonl", version_id=version
    )


def test_an_event_not_of_s3s_shape_starts_nothing_and_names_what_it_lacks(env: dict) -> None:
    """The upload event is read as Powertools models S3's EventBridge notification: one without
    the object's key is refused, naming the field, before any execution exists."""
    event = _event("training-data/w.jsonl", "v1")
    del event["detail"]["object"]["key"]
    with pytest.raises(ValidationError, match=r"detail\.object\.key\n  Field required"):
        call(env, "start_run", event)
    assert (
        env["sfn"].list_executions(stateMachineArn=env["settings"].state_machine_arn)["executions"]
        == []
    )


def test_invalid_dataset_raises_with_line_numbers_and_creates_nothing(env: dict) -> None:
    version = env["s3"].put_object(
        Bucket=BUCKET, Key="training-data/bad.jsonl", Body=GOOD + b"{oops\n"
    )["VersionId"]
    with pytest.raises(
        DatasetInvalid,
        match=r"1 problem \(line 2: not valid JSON .*\); full report s3://data/runs/bad-",
    ):
        call(env, "validate", _event("training-data/bad.jsonl", version))
    assert not boto3.client("sqs").list_queues().get("QueueUrls")


def test_the_happy_path_of_steps_then_teardown_and_notification(env: dict) -> None:
    s3 = env["s3"]
    version = s3.put_object(Bucket=BUCKET, Key="training-data/w.jsonl", Body=GOOD)["VersionId"]
    upload = {"bucket": BUCKET, "key": "training-data/w.jsonl", "version_id": version}
    checked = call(env, "validate", upload)
    registered = call(env, "register", upload, now=0.0)
    assert (
        registered["run_id"] == checked["run_id"]
        and registered["created"]
        and registered["config"]["recipe"] == "RFT_MULTITURN_LORA"
    )
    provisioned = call(env, "provision", {"run": registered})
    assert set(provisioned["queues"]) == {
        "rollout_requests",
        "rollout_responses",
        "generate_requests",
        "generate_responses",
        "dlq",
    }
    # The router's consumer reads the run's generate responses (and nothing else of it).
    (mapping,) = _consumer_mappings()
    assert mapping["EventSourceArn"].endswith(
        provisioned["queues"]["generate_responses"].rsplit("/", 1)[-1]
    )
    assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert call(env, "provision", {"run": registered}) == provisioned
    assert len(_consumer_mappings()) == 1
    # The default config trains Nova: its jobs invoke the rollout Lambda, which the run holds.
    assert provisioned["rollout_request_arn"] == env["settings"].rollout_lambda_arn
    down = call(env, "teardown", {"run_id": registered["run_id"]})
    assert down["leftover"] == 0 and down["queues_deleted"] == 5 and _consumer_mappings() == []
    told = call(
        env,
        "notify_end",
        {"run_id": registered["run_id"], "succeeded": True, "teardown": down},
        now=3600.0,
    )
    assert told["status"] == "SUCCEEDED" and told["message_id"] and told["duration_hours"] == 1.0


def test_a_failure_before_registration_is_still_notified(env: dict) -> None:
    sqs = boto3.client("sqs")
    inbox = sqs.create_queue(QueueName="inbox")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=inbox, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    boto3.client("sns").subscribe(
        TopicArn=env["settings"].alert_topic_arn,
        Protocol="sqs",
        Endpoint=arn,
        Attributes={"RawMessageDelivery": "true"},
    )
    told = call(
        env,
        "notify_end",
        {
            "run_id": "bad-123",
            "succeeded": False,
            "failed_state": "Validate",
            "error": "s3://data/x.jsonl: 2 problems (line 3: ...)",
        },
        now=5.0,
    )
    assert told["status"] == "FAILED" and told["message_id"]
    (message,) = sqs.receive_message(QueueUrl=inbox)["Messages"]
    assert message["Body"].startswith(
        "nova-mtrl run bad-123 FAILED\nfailed in Validate: s3://data/x.jsonl: 2 problems"
    )


def test_the_end_notification_records_how_the_run_ended(env: dict) -> None:
    s3 = env["s3"]
    version = s3.put_object(Bucket=BUCKET, Key="training-data/w.jsonl", Body=GOOD)["VersionId"]
    registered = call(
        env,
        "register",
        {"bucket": BUCKET, "key": "training-data/w.jsonl", "version_id": version},
        now=0.0,
    )
    call(
        env,
        "notify_end",
        {
            "run_id": registered["run_id"],
            "succeeded": False,
            "error": '{"errorType": "Boom", "errorMessage": "no"}',
        },
        now=10.0,
    )
    run = RunStore(boto3.client("dynamodb"), "runs").get(registered["run_id"])
    assert (run.status, run.error, run.evaluation) == ("failed", "Boom: no", None)
    version = s3.put_object(Bucket=BUCKET, Key="training-data/v.jsonl", Body=GOOD)["VersionId"]
    upload = {"bucket": BUCKET, "key": "training-data/v.jsonl", "version_id": version}
    succeeded = call(env, "register", upload, now=0.0)["run_id"]
    headline = "pass@1 0.31 → 0.58 (+0.27, 95% CI +0.12..+0.41; 256 held-out rollouts)"
    notice = call(
        env, "notify_end", {"run_id": succeeded, "succeeded": True, "evaluation": headline}, now=5.0
    )
    run = RunStore(boto3.client("dynamodb"), "runs").get(succeeded)
    assert (run.status, run.evaluation) == ("succeeded", headline)
    assert notice["evaluation"] == headline


# A config whose jobs never invoke the rollout Lambda: runs of it go side by side.
OPEN_WEIGHTS = "configs/open-weights.yaml"


def _provisioned(
    env: dict, name: str, *, now: float = 0.0, config: str | None = OPEN_WEIGHTS
) -> tuple[str, dict]:
    """Upload `training-data/<name>.jsonl` (for `config`; None: the default, Nova's), register and
    provision its run: (run id, upload)."""
    s3 = env["s3"]
    if config is not None:
        lora = (Path(__file__).parents[2] / "training_configs/rft_multiturn_lora.yaml").read_text()
        s3.put_object(Bucket=BUCKET, Key=config, Body=lora.replace("nova-lite-2", "qwen3-8b"))
    metadata = {CONFIG_METADATA_KEY: config} if config else {}
    key = f"training-data/{name}.jsonl"
    version = s3.put_object(Bucket=BUCKET, Key=key, Body=GOOD, Metadata=metadata)["VersionId"]
    upload = {"bucket": BUCKET, "key": key, "version_id": version}
    registered = call(env, "register", upload, now=now)
    call(env, "provision", {"run": registered})
    return registered["run_id"], upload


class RecordingCompute(RewardFleet, TrainingCluster):
    """Both planes in one: records which runs the reaper releases; `stuck` runs fail to delete."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.stuck: set[str] = set()

    def start(self, run: RunContext, *, workers: int) -> list[str]:
        raise AssertionError("the reaper starts nothing")

    def healthy(self, run: RunContext) -> int:
        return 0

    def stop(self, run: RunContext) -> int:
        self.calls.append(("stop", run.run_id))
        return 2

    def scale_up(self, run: RunContext, *, instances: int) -> None:
        raise AssertionError("the reaper scales nothing up")

    def nodes_ready(self, run: RunContext) -> int:
        return 0

    def submit(self, run: RunContext) -> str:
        raise AssertionError("the reaper submits nothing")

    def submit_evaluation(self, run: RunContext, *, stage: EvaluationStage) -> str:
        raise AssertionError("the reaper evaluates nothing")

    def evaluation_status(self, run: RunContext, *, stage: EvaluationStage) -> JobStatus:
        raise AssertionError("the reaper evaluates nothing")

    def status(self, run: RunContext) -> JobStatus:
        return JobStatus("running")

    def delete(self, run: RunContext) -> int:
        if run.run_id in self.stuck:
            raise RuntimeError(f"namespace of {run.run_id} is still terminating")
        self.calls.append(("delete", run.run_id))
        return 7

    def scale_down(self, run: RunContext) -> None:
        self.calls.append(("scale_down", run.run_id))

    def release_idle(self, *, immediately: bool = False) -> bool:
        self.calls.append(("release_idle", "immediately" if immediately else "after keep-warm"))
        return True


@pytest.fixture
def reaper_compute(env: dict) -> RecordingCompute:
    return env["compute"]


def test_the_reaper_tears_down_overdue_and_orphaned_runs_only(
    env: dict, reaper_compute: RecordingCompute
) -> None:
    settings, sfn = env["settings"], env["sfn"]
    runs = RunStore(boto3.client("dynamodb"), "runs")
    ids = {}
    for name in ("on-time", "overdue", "orphaned", "finished"):
        ids[name], upload = _provisioned(env, name, now=1000.0 if name != "overdue" else 0.0)
        if name != "orphaned":
            call(env, "start_run", upload)
    runs.update(ids["finished"], now=1.0, status="succeeded")
    deadline_of_overdue = runs.get(ids["overdue"]).deadline_at
    result = call(env, "reap", {}, now=deadline_of_overdue + 1)
    reaped = {entry["run_id"]: entry for entry in result["reaped"]}
    assert set(reaped) == {ids["overdue"], ids["orphaned"]}
    assert (
        reaped[ids["overdue"]]["reason"] == "past its deadline"
        and reaped[ids["orphaned"]]["reason"] == "its execution is MISSING"
    )
    assert all(entry["leftover"] == 0 for entry in reaped.values())
    # Their compute went first: workers stopped, job deleted, nodes let go.
    assert sorted(reaper_compute.calls) == sorted(
        (call, ids[name])
        for name in ("overdue", "orphaned")
        for call in ("stop", "delete", "scale_down")
    )
    assert all(entry["job_objects_deleted"] == 7 for entry in reaped.values())
    execution = (
        f"{settings.state_machine_arn.replace(':stateMachine:', ':execution:')}:{ids['overdue']}"
    )
    assert sfn.describe_execution(executionArn=execution)["status"] == "ABORTED"
    assert (
        runs.get(ids["overdue"]).status == "failed" and runs.get(ids["on-time"]).status == "active"
    )
    queues = boto3.client("sqs").list_queues().get("QueueUrls", [])
    assert sum(ids["on-time"] in url for url in queues) == 5
    assert not [url for url in queues if ids["overdue"] in url or ids["orphaned"] in url]
    # Only the overdue run's execution was running: it is stopped saying why.
    assert env["clients"].recorded["stepfunctions"].sent("stop_execution") == [
        {"executionArn": execution, "error": "DeadlinePassed",
         "cause": f"run {ids['overdue']}: past its deadline"},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "problems"),
    [
        (b"", "1 problem (file: no records: the file is empty or only blank lines"),
        (b"\xff\xfe\x00garbage", "1 problem (line 1: not valid UTF-8 (byte 1)"),
        (
            b'{"id": "a"}\n{"id": "a", "metadata": {"prompt": "p"}}\n'
            b'{"id": "a", "metadata": {"prompt": "p"}}\n',
            "2 problems (line 1: metadata: Field required",
        ),
        (b"[1, 2, 3]\n" * 3, "3 problems (line 1: not a JSON object"),
        (
            b'{"id": "  ", "metadata": {"prompt": "p"}}\n',
            "1 problem (line 1: id: must not be empty or only whitespace",
        ),
        (
            b'{"id": "a", "metadata": {"prompt": []}}\r\n\r\n',
            "1 problem (line 1: metadata.prompt: must have at least one message",
        ),
    ],
)
def test_the_validate_lambda_rejects_malformed_datasets_with_line_numbers(
    env: dict, body: bytes, problems: str
) -> None:
    """The error names how many problems, the first one (line, field, what is wrong) and where
    the full report is."""
    version = env["s3"].put_object(Bucket=BUCKET, Key="training-data/m.jsonl", Body=body)[
        "VersionId"
    ]
    with pytest.raises(DatasetInvalid) as raised:
        call(env, "validate", _event("training-data/m.jsonl", version))
    message = str(raised.value)
    assert f"s3://data/training-data/m.jsonl: {problems}" in message, message
    assert "full report s3://data/runs/" in message


def test_a_run_whose_compute_will_not_go_yet_is_reaped_next_time(
    env: dict, reaper_compute: RecordingCompute
) -> None:
    runs = RunStore(boto3.client("dynamodb"), "runs")
    run_id, upload = _provisioned(env, "lost", now=5.0)  # the newest: the reaper's first
    other, _ = _provisioned(env, "also-lost")
    reaper_compute.stuck.add(run_id)
    first = call(env, "reap", {}, now=10.0)
    assert [entry["run_id"] for entry in first["reaped"]] == [other]  # the others go on
    assert first["retry"] == [
        {"run_id": run_id, "error": f"RuntimeError: namespace of {run_id} is still terminating"}
    ]
    assert runs.get(run_id).status == "active"  # still unfinished: the next schedule retries
    reaper_compute.stuck.clear()
    second = call(env, "reap", {}, now=20.0)
    assert [entry["run_id"] for entry in second["reaped"]] == [run_id]
    assert runs.get(run_id).status == "failed"


def test_teardown_on_request_stops_a_running_run_now_and_can_repeat(
    env: dict, reaper_compute: RecordingCompute
) -> None:
    settings, sfn = env["settings"], env["sfn"]
    runs = RunStore(boto3.client("dynamodb"), "runs")
    run_id, upload = _provisioned(env, "now", config=None)  # Nova's: it holds the rollout Lambda
    call(env, "start_run", upload)
    # The schedule leaves a running, on-time run alone; a request does not.
    assert call(env, "reap", {"source": "aws.events", "detail-type": "Scheduled Event"}, now=10.0)["reaped"] == []  # fmt: skip
    result = call(env, "reap", {"run_id": run_id}, now=10.0)
    (entry,) = result["reaped"]
    assert entry["reason"] == "torn down on request (mtrl teardown)" and entry["leftover"] == 0
    assert settings.router_wiring(env["clients"]).conversations.rollout_lambda_holder() is None
    execution = sfn.describe_execution(executionArn=settings.execution_arn(run_id))
    assert execution["status"] == "ABORTED"
    assert (runs.get(run_id).status, runs.get(run_id).error) == (
        "failed", "reaped: torn down on request (mtrl teardown)",
    )  # fmt: skip
    again = call(env, "reap", {"run_id": run_id}, now=20.0)
    assert again["reaped"][0]["leftover"] == 0 and runs.get(run_id).status == "failed"
    assert reaper_compute.calls.count(("delete", run_id)) == 2  # idempotent all the way down
    unknown = call(env, "reap", {"run_id": "nope"}, now=20.0)
    assert unknown == {"reaped": [], "retry": [], "unknown": "nope", "released_idle": None}


def test_releasing_idle_nodes_on_request_skips_the_keep_warm(
    env: dict, reaper_compute: RecordingCompute
) -> None:
    result = call(env, "reap", {"release_idle": True})
    assert result == {"reaped": [], "retry": [], "unknown": None, "released_idle": True}
    assert reaper_compute.calls == [("release_idle", "immediately")]
