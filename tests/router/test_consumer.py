"""The generate-response consumer: completions recorded once; bad messages fail visibly."""

from __future__ import annotations

import json

import boto3
import pytest

from domain.protocol import GenerateResponse, dump
from lambdas.clients import Clients
from lambdas.router import consumer
from lambdas.router.metrics import PROBLEMS_KEPT, metered_entry
from tests.router.conftest import RUN, TABLE, Router


def _response(step_id: str, content: str = "[crane]") -> str:
    return dump(
        GenerateResponse(
            sample_id=step_id.rsplit("_", 1)[0],
            step_id=step_id,
            data={
                "choices": [
                    {
                        "message": {"role": "assistant", "content": content},
                        "logprobs": {"content": [{"token": "[", "logprob": -0.1}]},
                    }
                ]
            },
        )
    )


def _event(router: Router, *bodies: str, queue: str | None = None) -> dict:
    arn = router.queue_arn(queue or router.queues.generate_responses)
    return {
        "Records": [
            {"messageId": f"m{i}", "body": body, "eventSourceARN": arn}
            for i, body in enumerate(bodies)
        ]
    }


def test_completions_are_recorded_and_redeliveries_change_nothing(router: Router) -> None:
    router.store.start_step(RUN, "s_0_1", sample_id="s_0", now=router.clock())
    assert router.consumer.handle(_event(router, _response("s_0_1"))) == {"batchItemFailures": []}
    assert router.consumer.handle(_event(router, _response("s_0_1", "[other]"))) == {
        "batchItemFailures": []
    }
    step = router.store.get_step(RUN, "s_0_1")
    assert (
        step.status == "completed" and step.result["choices"][0]["message"]["content"] == "[crane]"
    )
    assert step.result["choices"][0]["logprobs"]["content"][0]["logprob"] == -0.1
    assert (router.consumer.counters.completed, router.consumer.counters.duplicates) == (1, 1)


def test_bad_messages_are_failed_counted_and_do_not_stop_the_batch(router: Router) -> None:
    router.store.start_step(RUN, "s_0_1", sample_id="s_0", now=router.clock())
    bodies = [
        "{not json",
        json.dumps({"version": "v7", "sample_id": "s", "step_id": "s_1", "data": {"choices": []}}),
        _response("ghost_0_1"),
        _response("s_0_1"),
    ]
    result = router.consumer.handle(_event(router, *bodies))
    assert result == {
        "batchItemFailures": [
            {"itemIdentifier": "m0"},
            {"itemIdentifier": "m1"},
            {"itemIdentifier": "m2"},
        ]
    }
    counters = router.consumer.counters
    assert (counters.malformed, counters.unknown_steps, counters.completed) == (2, 1, 1)
    assert router.store.get_step(RUN, "ghost_0_1") is None


def test_a_message_from_a_queue_of_no_run_is_failed(router: Router) -> None:
    stranger = router.sqs.create_queue(QueueName="stranger.fifo", Attributes={"FifoQueue": "true"})[
        "QueueUrl"
    ]
    result = router.consumer.handle(_event(router, _response("s_0_1"), queue=stranger))
    assert result == {"batchItemFailures": [{"itemIdentifier": "m0"}]}
    assert router.consumer.counters.unknown_queues == 1


def test_out_of_order_responses_are_each_recorded_once(router: Router) -> None:
    for step in ("s_0_1", "s_0_2", "t_0_1"):
        router.store.start_step(RUN, step, sample_id=step.rsplit("_", 1)[0], now=router.clock())
    # Later steps first.
    result = router.consumer.handle(
        _event(router, _response("t_0_1"), _response("s_0_2"), _response("s_0_1"))
    )
    assert result == {"batchItemFailures": []}
    assert {router.store.get_step(RUN, s).status for s in ("s_0_1", "s_0_2", "t_0_1")} == {
        "completed"
    }


def test_the_lambda_publishes_each_invocations_counts_as_cloudwatch_metrics(
    router: Router, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the consumer counted leaves the container (embedded metric format on the log):
    per invocation, then reset; its list of problems stays bounded in a warm container."""
    # The entry point's consumer, as composed for a function whose environment names the table.
    environment = {"TABLE_NAME": TABLE}
    made = consumer.consumer_for(environment, Clients(boto3.Session()))
    handler = metered_entry("consumer", lambda: made, environment)
    router.store.start_step(RUN, "s_0_1", sample_id="s_0", now=router.clock())
    handler(_event(router, "{not json", _response("s_0_1")), None)
    (emitted,) = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]
    (definition,) = emitted["_aws"]["CloudWatchMetrics"]
    assert definition["Namespace"] == "nova-mtrl/router"
    assert {"deployment", "service"} <= set(definition["Dimensions"][0])
    assert (emitted["service"], emitted["malformed"], emitted["completed"]) == (
        "consumer",
        [1],
        [1],
    )
    assert {m["Name"] for m in definition["Metrics"]} == {"malformed", "completed"}  # no zeros

    handler(_event(router, *["{not json"] * 3), None)
    (again,) = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]
    assert again["malformed"] == [3] and "completed" not in again  # this invocation's counts only

    kept = made.counters.problems
    for _ in range(PROBLEMS_KEPT + 10):
        made.handle(_event(router, "{not json"))
    assert len(kept) == PROBLEMS_KEPT
