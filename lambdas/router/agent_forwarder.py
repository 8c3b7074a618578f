"""The agent Lambda: what SageMaker's managed multi-turn RL job invokes with each rollout request
(the job document's `AgentConfig.CustomAgentLambdaConfig.LambdaArn`; the request as
domain/agent_rft.py reads it). It puts the request on its run's rollout-request queue, where the
run's reward workers take it, play the episode against the job's policy and report it to the
job's runtime service (reward_envs/worker/agent_mode.py): a bridge to workers elsewhere, as the
SageMaker SDK's `CustomAgentLambda` describes one.

The run is the one whose job the request names: Provision records each serverless run's job
(lambdas/router/conversations.py, `job#<name>`), so a request reaches that run's queue only, and
a request for a job no run has, or whose run is torn down, is refused. The request is checked
before it is queued — a job ARN, a trajectory, an instance that is one of our dataset records —
so the service sees a bad one fail at once. A retried invocation carries the same trajectory:
its deduplication id is the job's and the trajectory's, so SQS keeps one.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from pydantic import ValidationError

from domain.agent_rft import AgentRolloutRequest, NotARollout, job_name_of, rollout_request_of
from lambdas.clients import composed_once
from lambdas.router.metrics import metered_entry
from lambdas.router.rollout_forwarder import RunQueueForwarder, forwarder_for


class AgentForwarder(RunQueueForwarder):
    def handle(self, event: Any) -> dict[str, Any]:
        try:
            request = AgentRolloutRequest.model_validate(event)
            job = job_name_of(request.metadata.job_arn)
            # Checked here, played by the worker: a record no environment could read fails now.
            rollout = rollout_request_of(request, max_length=1)
        except (ValidationError, NotARollout):
            self.counters.malformed += 1
            raise
        run_id = self.store.run_of_job(job, now=self.clock())
        if run_id is None:
            raise self._refused(
                f"job {job} is no run's: none of this deployment's runs started it, or its run "
                "is torn down"
            )
        trajectory = request.metadata.trajectory_id
        stage = self._forward(
            run_id,
            rollout.sample_id,
            request.model_dump_json(),
            group=trajectory,
            once=f"{request.metadata.job_arn}\0{trajectory}",
        )
        return {"run_id": run_id, "trajectory_id": trajectory, "stage": stage, "forwarded": True}


_forward = metered_entry(
    "agent-forwarder",
    composed_once(functools.partial(forwarder_for, kind=AgentForwarder), os.environ),
    os.environ,
)


def handler(event: Any, context: Any) -> dict[str, Any]:
    """The Lambda entry point: the event is the rollout request itself."""
    return _forward(event, context)
