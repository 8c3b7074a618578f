"""The agent Lambda: a managed job's rollout request reaches the run that started the job, and
only it, once however often the service retries the invocation, marked with that run's open
phase — a training job's or an evaluation job's alike; a request for no run's job, for a run torn down, or not one a worker could play is
refused with the reason, and nothing is queued."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from domain.agent_rft import AgentRolloutRequest, NotARollout, trajectory_number
from domain.episodes import EvaluationStage, phase_of
from domain.protocol import sample_id_for
from lambdas.router.agent_forwarder import AgentForwarder
from lambdas.router.rollout_forwarder import RolloutRefused
from tests.router.conftest import MODEL, OTHER_RUN, OTHER_TOKEN, RUN, TOKEN, Router

ARN = "arn:aws:sagemaker:us-east-1:123456789012:job/AgentRFT/"
JOBS = {RUN: "test-run-run-1", OTHER_RUN: "test-run-run-2"}
EVALUATION_ARN = "arn:aws:sagemaker:us-east-1:123456789012:job/AgentRFTEvaluation/"


def request(run: str = RUN, trajectory: str = "trajectory-000001", **instance: Any) -> dict:
    return {
        "instance": {"id": "wordle-7", "metadata": {"prompt": "Play.", "answer": "crane"}}
        | instance,
        "metadata": {"job_arn": ARN + JOBS[run], "trajectory_id": trajectory,
                     "endpoint": "https://job-runtime.sagemaker.us-east-1.api.aws",
                     "region": "us-east-1"},
        "inference_params": {"temperature": 0.7},
    }  # fmt: skip


@pytest.fixture
def forwarder(router: Router) -> AgentForwarder:
    """Both runs provisioned as serverless runs (their jobs recorded), training open."""
    for run, token, queues in ((RUN, TOKEN, router.queues), (OTHER_RUN, OTHER_TOKEN, router.other_queues)):  # fmt: skip
        router.store.put_run(run, token=token, queues=queues.urls(), model=MODEL,
                             now=router.clock(), deadline_at=router.clock() + 3600,
                             jobs=(JOBS[run], f"{JOBS[run]}-baseline"))  # fmt: skip
        router.store.open_phase(run, phase_of(None), now=router.clock())
    return AgentForwarder(router.sqs, router.store, prefix="test", clock=router.clock)


def test_a_request_lands_on_its_own_runs_queue_once(
    router: Router, forwarder: AgentForwarder
) -> None:
    sent = request()
    assert forwarder.handle(sent) == {
        "run_id": RUN, "trajectory_id": "trajectory-000001", "stage": None, "forwarded": True,
    }  # fmt: skip
    forwarder.handle(sent)  # the service's retry of the same invocation
    forwarder.handle(request(OTHER_RUN, "trajectory-000002"))
    (mine,) = router.messages(router.queues.rollout_requests)
    assert AgentRolloutRequest.model_validate_json(
        mine["Body"]
    ) == AgentRolloutRequest.model_validate(sent)
    assert mine["Attributes"]["MessageGroupId"] == "trajectory-000001"
    (theirs,) = router.messages(router.other_queues.rollout_requests)
    assert json.loads(theirs["Body"])["metadata"]["trajectory_id"] == "trajectory-000002"
    sample = sample_id_for("wordle-7", trajectory_number("trajectory-000001"))
    assert router.store.sample_phase(RUN, sample) == phase_of(None)


def test_an_evaluation_jobs_request_reaches_its_run_in_the_evaluation_phase(
    router: Router, forwarder: AgentForwarder
) -> None:
    """The run's baseline evaluation job (AgentRFTEvaluation) is the run's too: its request is
    queued for the run's workers, its sample marked with the phase the run has open."""
    router.store.open_phase(RUN, phase_of(EvaluationStage.BASELINE), now=router.clock())
    sent = request(trajectory="trajectory-000009")
    sent["metadata"]["job_arn"] = f"{EVALUATION_ARN}{JOBS[RUN]}-baseline"
    assert forwarder.handle(sent)["stage"] == EvaluationStage.BASELINE
    (queued,) = router.messages(router.queues.rollout_requests)
    assert json.loads(queued["Body"])["metadata"]["job_arn"] == sent["metadata"]["job_arn"]
    sample = sample_id_for("wordle-7", trajectory_number("trajectory-000009"))
    assert router.store.sample_phase(RUN, sample) == phase_of(EvaluationStage.BASELINE)
    router.store.remove_run(RUN)  # torn down: its evaluation job is no run's either
    with pytest.raises(RolloutRefused, match=f"job {JOBS[RUN]}-baseline is no run's"):
        forwarder.handle(sent)


def test_a_job_of_no_run_or_of_a_run_torn_down_is_refused(
    router: Router, forwarder: AgentForwarder
) -> None:
    stranger = request()
    stranger["metadata"]["job_arn"] = ARN + "someone-elses-job"
    with pytest.raises(RolloutRefused, match="job someone-elses-job is no run's"):
        forwarder.handle(stranger)
    router.store.remove_run(RUN)
    with pytest.raises(RolloutRefused, match=f"job {JOBS[RUN]} is no run's"):
        forwarder.handle(request())
    router.clock.sleep(3600 + 3601)  # past the other run's registration
    with pytest.raises(RolloutRefused, match="is no run's"):
        forwarder.handle(request(OTHER_RUN))
    assert router.messages(router.queues.rollout_requests) == []
    assert forwarder.counters.refused == 3


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (lambda r: r["metadata"].update(job_arn="arn:aws:sagemaker:us-east-1:123456789012:job/GenAIEvaluation/x"),
         NotARollout, "is not the ARN of an AgentRFT or AgentRFTEvaluation job"),
        (lambda r: r["metadata"].pop("trajectory_id"), ValidationError, "trajectory_id"),
        (lambda r: r["instance"].pop("metadata"), NotARollout, "instance is not a dataset record: metadata"),
        (lambda r: r.update(instance="a line"), ValidationError, "instance"),
    ],
    ids=["another job category", "no trajectory", "not a record", "not an object"],
)  # fmt: skip
def test_a_request_no_worker_could_play_is_refused_before_it_is_queued(
    router: Router, forwarder: AgentForwarder, change: Any, error: type, message: str
) -> None:
    sent = request()
    change(sent)
    with pytest.raises(error, match=message):
        forwarder.handle(sent)
    assert router.messages(router.queues.rollout_requests) == []
    assert forwarder.counters.malformed == 1
