"""Waiting on a pipeline execution in tests: polled with a bound, and what it went through when
the bound is hit."""

from __future__ import annotations

import time
from typing import Any


def entered_states(sfn: Any, execution_arn: str) -> list[str]:
    events = sfn.get_execution_history(executionArn=execution_arn)["events"]
    return [
        e["stateEnteredEventDetails"]["name"] for e in events if "stateEnteredEventDetails" in e
    ]


def finished(sfn: Any, execution_arn: str, *, timeout: float = 60) -> dict[str, Any]:
    """DescribeExecution once the execution is no longer RUNNING."""
    deadline = time.monotonic() + timeout
    while (described := sfn.describe_execution(executionArn=execution_arn))["status"] == "RUNNING":
        if time.monotonic() > deadline:
            last = entered_states(sfn, execution_arn)[-6:]
            raise AssertionError(f"{execution_arn} did not finish; last states: {last}")
        time.sleep(0.05)
    return described


def wait_for_state(sfn: Any, execution_arn: str, state: str, *, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while state not in (entered := entered_states(sfn, execution_arn)):
        assert time.monotonic() < deadline, (
            f"{execution_arn} never entered {state}; last states: {entered[-6:]}"
        )
        time.sleep(0.05)
