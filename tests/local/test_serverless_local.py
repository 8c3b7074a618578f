"""`mtrl local` on the serverless plane: the deployed plane (lambdas/pipeline/serverless_training.py)
starts the run's managed job on the local job service (mtrl/local/managed_job.py), whose
training loop sends each rollout request to the agent Lambda; the run's reward workers, in agent
mode, play them against the runtime stand-in and report there (and to the router, whose reports
make the run's curve); the policy learns from the job's reports. The held-out records are
played before and after by the service's evaluation jobs (AgentRFTEvaluation) of the base model
and the package the job registered, through the same Lambda and workers. No node is asked for,
and nothing is left."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import boto3
import pandas as pd
import pytest
import yaml
from botocore.exceptions import ClientError, ParamValidationError

from mtrl.local.managed_job import LocalJobService, ProgressLines
from mtrl.local.run import LocalRunError, LocalRunOptions, prepare, run_local
from mtrl.local.waits import PlaneChanges
from tests.conftest import Synthesized

EXAMPLE = Path(__file__).parents[2] / "examples" / "wordle"


@pytest.fixture
def serverless_config(tmp_path: Path) -> Path:
    """The serverless example, six steps (8 secrets x 4 rollouts each), evaluated on 8 held-out
    secrets."""
    config = yaml.safe_load((EXAMPLE / "serverless.yaml").read_text()) | {
        "max_steps": 6, "eval_max_records": 8,
    }  # fmt: skip
    path = tmp_path / "serverless.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_serverless_wordle_run_learns_through_the_agent_lambda_and_leaves_nothing(
    tmp_path: Path, serverless_config: Path, default_app: Synthesized
) -> None:
    outcome, directory = run_local(
        LocalRunOptions(EXAMPLE / "train.jsonl", config=str(serverless_config), out_dir=tmp_path),
        template=default_app.template("pipeline"),
        timeout_seconds=300,
    )
    assert outcome.status == "SUCCEEDED", (outcome.error, outcome.cause)
    report = json.loads((directory / "report.json").read_text())
    curve = report["reward_curve"]
    assert [point["step"] for point in curve] == [1, 2, 3, 4, 5, 6]
    assert curve[-1]["mean_reward"] > curve[0]["mean_reward"] + 0.3  # it learned
    assert report["leftover"] == {"resources": 0, "processes": 0, "pollers": 0, "total": 0}
    # Workers only: the managed job runs on the service's capacity, no node is asked for.
    assert [e["action"] for e in report["compute_events"]] == ["start_workers", "stop_workers"]
    outputs = directory / "outputs"
    trained = [json.loads(line) for line in (outputs / "metrics.jsonl").read_text().splitlines()]
    # The run's curve is what its workers reported to the router (the managed job writes none
    # of ours): a window of 32 reports a step, none failed.
    assert [(m["source"], m["rollouts"], m["failed_rollouts"]) for m in trained] == [
        ("rollout_reports", 32, 0)
    ] * 6
    assert [m["mean_reward"] for m in trained] == pytest.approx(
        [point["mean_reward"] for point in curve]
    )
    # The training job's channel: the records not held out; the evaluation jobs': 8 held out.
    training = (outputs / "data" / "training.jsonl").read_text().splitlines()
    held_out = (outputs / "data" / "evaluation.jsonl").read_text().splitlines()
    assert len(held_out) == 8 and not {json.loads(r)["id"] for r in held_out} & {
        json.loads(r)["id"] for r in training
    }
    # Evaluated before and after by AWS's evaluation jobs: each held-out secret 4 times
    # (eval_samples: the job's eval_group_size), the trained package better than the base.
    assert {"EvaluateBaseline", "BaselineEvaluation", "EvaluateFinal", "FinalEvaluation"} <= set(
        report["states"]
    )
    evaluation = report["evaluation"]
    baseline, final = evaluation["baseline"], evaluation["final"]
    assert (baseline["n"], final["n"], baseline["records"], final["records"]) == (32, 32, 8, 8)
    assert final["mean_reward"] > baseline["mean_reward"] + 0.2
    for stage in (baseline, final):  # every rollout scored, none failed
        assert (stage["scored"], stage["env_error_rate"], stage["timeout_rate"]) == (32, 0.0, 0.0)
    # Every trajectory played, in training and in both evaluations, was kept once by the worker
    # that played it.
    trajectories = pd.read_parquet(outputs / "trajectories")
    assert len(trajectories) == trajectories["sample_id"].nunique() == 6 * 32 + 2 * 32
    assert (outputs / "checkpoints" / "final.npz").is_file()
    # The job registered the trained model itself, in the deployment's group: Collect records
    # that package rather than registering one of its own.
    summary = json.loads((outputs / "summary.json").read_text())
    assert re.fullmatch(
        r"arn:aws:sagemaker:us-east-1:\d{12}:model-package/nova-mtrl-models/1",
        summary["model_package"],
    )
    assert summary["evaluation"] == evaluation
    assert "SUCCEEDED" in (directory / "notification.txt").read_text()


def test_a_serverless_config_is_played_by_the_local_policy_only(
    tmp_path: Path, serverless_config: Path
) -> None:
    options = LocalRunOptions(
        EXAMPLE / "train.jsonl", config=str(serverless_config), out_dir=tmp_path, trainer="llm"
    )
    with pytest.raises(LocalRunError, match="plane serverless: .* leave out --trainer llm"):
        prepare(options)


@pytest.fixture
def service() -> Any:
    with LocalJobService(
        lambda_client=None, s3=None, sagemaker=None, changes=PlaneChanges(), region="us-east-1"
    ) as running:
        yield running


def _code(error: pytest.ExceptionInfo[ClientError]) -> str:
    return error.value.response["Error"]["Code"]


def test_the_job_service_answers_as_botocores_model_says(service: LocalJobService) -> None:
    """What the plane reads from it: a job no one made is ResourceNotFound (DescribeJob and
    StopJob name it), the public hub's model has its ARN, another hub's is not found."""
    with pytest.raises(ClientError) as missing:
        service.describe_job(JobName="nova-mtrl-run-x", JobCategory="AgentRFT")
    assert _code(missing) == "ResourceNotFound"
    with pytest.raises(ClientError) as not_stopped:
        service.stop_job(JobName="nova-mtrl-run-x", JobCategory="AgentRFT")
    assert _code(not_stopped) == "ResourceNotFound"
    model = service.describe_hub_content(
        HubName="SageMakerPublicHub", HubContentType="Model",
        HubContentName="nova-textgeneration-lite-v2",
    )  # fmt: skip
    assert model["HubContentArn"] == (
        "arn:aws:sagemaker:us-east-1:aws:hub-content/SageMakerPublicHub/Model/"
        "nova-textgeneration-lite-v2/1.0.0"
    )
    with pytest.raises(ClientError) as elsewhere:
        service.describe_hub_content(
            HubName="MyHub", HubContentType="Model", HubContentName="nova-textgeneration-lite-v2"
        )
    assert _code(elsewhere) == "ResourceNotFound"


def test_a_request_botocore_would_refuse_is_refused_and_nothing_starts(
    service: LocalJobService,
) -> None:
    request = {
        "JobName": "nova-mtrl-run-x", "JobCategory": "AgentRFT", "JobConfigSchemaVersion": "1.0.0",
        "RoleArn": "arn:aws:iam::123456789012:role/nova-mtrl-agent-rft-job",
    }  # fmt: skip
    with pytest.raises(ParamValidationError, match="JobConfigDocument"):
        service.create_job(**request)
    # The same checks as botocore's client, which refuses it before sending.
    client = boto3.client("sagemaker", region_name="us-east-1", aws_access_key_id="a",
                          aws_secret_access_key="b")  # fmt: skip
    with pytest.raises(ParamValidationError, match="JobConfigDocument"):
        client.create_job(**request)
    # A job for no run this session knows: refused, nothing made.
    with pytest.raises(ClientError) as unknown:
        service.create_job(**request, JobConfigDocument="{}")
    assert _code(unknown) == "ValidationException" and service.jobs == {}


def test_progress_lines_are_kept_whole_however_they_are_written() -> None:
    entries: list[dict[str, Any]] = []
    changes = PlaneChanges()
    out = ProgressLines(entries, changes)
    print(json.dumps({"step": 1}), file=out, flush=True)
    out.write('{"step": ')
    assert entries == [{"step": 1}] and changes.after(0, seconds=0) == 1
    out.write('2}\n\n{"step": 3}\n')
    assert entries == [{"step": 1}, {"step": 2}, {"step": 3}]
    assert changes.after(0, seconds=0) == 3  # a change a line, none for the blank one
