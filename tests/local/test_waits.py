"""Local mode's Wait states (mtrl/local/waits.py), in moto's own Step Functions interpreter: a
Wait ends at the first change of the local planes since its execution's previous Wait ended
(the first Wait: since local mode began), else after its seconds (here 600: a test that does not
see its change in time fails, it never passes by waiting)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import boto3
import pytest
from moto import mock_aws
from moto.stepfunctions.parser.asl.component.state.wait.wait_function.wait_function import (
    WaitFunction,
)

from domain.backends import JobStatus, Phase, RunContext
from mtrl.local.backends import LocalTrainingCluster, TrainerProgram
from mtrl.local.waits import PlaneChanges, waits_end_on
from tests.executions import finished, wait_for_state
from training_configs.schema import load_training_config

TWO_WAITS = {
    "StartAt": "Poll",
    "States": {
        "Poll": {"Type": "Wait", "SecondsPath": "$.seconds", "Next": "PollAgain"},
        "PollAgain": {"Type": "Wait", "SecondsPath": "$.seconds", "Next": "Done"},
        "Done": {"Type": "Succeed"},
    },
}


def test_after_returns_at_once_for_changes_it_has_not_seen_else_at_the_next() -> None:
    changes = PlaneChanges()
    assert changes.after(0, seconds=0) == 0  # nothing yet: its seconds (none) are up
    changes.changed()
    assert changes.after(0, seconds=600) == 1  # one it has not seen: at once
    later = threading.Timer(0.05, changes.changed)
    later.start()
    assert changes.after(1, seconds=600) == 2  # the next one, long before 600 s
    later.join()


def test_a_wait_ends_at_the_first_change_since_the_executions_previous_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "test")
    original = WaitFunction._wait_interval
    changes = PlaneChanges()
    changes.changed()  # before the execution: its first Wait does not wait for another
    executed = {"stepfunctions": {"execute_state_machine": True}}
    with mock_aws(config=executed), waits_end_on(changes):
        sfn = boto3.client("stepfunctions", region_name="us-east-1")
        machine = sfn.create_state_machine(
            name="polls",
            definition=json.dumps(TWO_WAITS),
            roleArn="arn:aws:iam::123456789012:role/polls",
        )["stateMachineArn"]
        execution = sfn.start_execution(
            stateMachineArn=machine, name="slow", input=json.dumps({"seconds": 600})
        )["executionArn"]
        wait_for_state(sfn, execution, "PollAgain")
        # Nothing changed since Poll ended: PollAgain waits (its 600 s, or the next change).
        assert sfn.describe_execution(executionArn=execution)["status"] == "RUNNING"
        changes.changed()
        assert finished(sfn, execution, timeout=60)["status"] == "SUCCEEDED"
        # A Wait of 0 seconds does not wait, changes or none.
        quick = sfn.start_execution(
            stateMachineArn=machine, name="quick", input=json.dumps({"seconds": 0})
        )
        assert finished(sfn, quick["executionArn"], timeout=60)["status"] == "SUCCEEDED"
    assert WaitFunction._wait_interval is original  # moto's own again


def test_the_training_cluster_tells_what_it_does_and_each_line_and_end_of_its_job(
    tmp_path: Path,
) -> None:
    """Each change comes after what it changed: once the job's end is told, its status has
    ended (the process reaped), so the status call after a Wait sees it."""
    changes = PlaneChanges()
    cluster = LocalTrainingCluster(
        environment={}, log_dir=tmp_path, changes=changes,
        program=TrainerProgram(module="tests.local.one_step_trainer"),
    )  # fmt: skip
    run = RunContext(
        run_id="r", queues={}, router_url=None, run_token="t", bucket="b", dataset_key="k",
        dataset_version=None, output_prefix="runs/r/",
        config=load_training_config("rft_multiturn_lora"),
    )  # fmt: skip
    cluster.scale_up(run, instances=1)
    assert changes.after(0, seconds=0) == 1
    cluster.submit(run)
    seen = changes.after(1, seconds=0)
    assert seen == 2
    while seen < 4:  # its step line, then its end
        now = changes.after(seen, seconds=60)
        assert now > seen, "the job told nothing within 60 s"
        seen = now
    assert cluster.status(run) == JobStatus(Phase.SUCCEEDED, step=1)
    assert cluster.progress["r"] == [{"step": 1}]
