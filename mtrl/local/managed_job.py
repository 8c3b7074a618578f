"""SageMaker's managed multi-turn RL job in local mode. The serverless plane
(lambdas/pipeline/serverless_training.py) runs unchanged against `LocalJobService`, a stand-in
of the SageMaker calls it makes, and the jobs it starts are played here:

- `LocalJobService`: DescribeHubContent, CreateJob, DescribeJob and StopJob, each request and
  answer held to botocore's model of SageMaker, errors raised as botocore raises a service's.
  CreateJob starts the job in a thread of this process — a training job (`AgentRFT`) or a
  held-out evaluation (`AgentRFTEvaluation`); DescribeJob reads its state as the service's
  JobStatus, and a training job's document's ServiceOutput as the SDK's AgentRFTJob reads it:
  ProgressInfo while it trains, the package it registered the trained model as
  (OutputModelPackageArn, in the document's output group) once it completed. It serves the
  job runtime stand-in (mtrl/local/job_runtime.py) the run's workers call for each turn.
- `AgentRollouts`: how either job plays trajectories: each asked of the document's agent
  Lambda (Lambda's Invoke) with the SDK's RolloutRequest; the run's workers play it, the job's
  policy answering each turn through the runtime, and report it there.
- `ManagedJobTrainer`: the training loop, as the service runs one for its document: GRPO on
  the local policy (local_trainer/). Each step draws prompts from the document's train
  channel, `group_size` new trajectories of each; the trajectories' rewards (summed over
  turns) make the update. Metrics and checkpoints as the local trainer's.
- `ManagedJobEvaluation`: an evaluation job: its evaluation channel's records played by the
  base model's policy or the trained package's, nothing learned.
- `LocalServerlessPlane`: the plane local mode composes: the real one over this service, which
  it tells each run's context before CreateJob — the local policy's settings and the run's
  outputs are not in a job document, as the service's own hyperparameters are not in ours.
"""

from __future__ import annotations

import datetime
import json
import logging
import threading
import time
import zlib
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO
from urllib.parse import urlsplit

import botocore.session
import numpy as np
from botocore.exceptions import ClientError, ParamValidationError
from botocore.validate import ParamValidator

from domain.agent_rft import AgentRolloutRequest, RolloutMetadata, job_name_of, runtime_endpoint
from domain.backends import RunContext
from domain.dataset import DatasetRecord
from domain.episodes import EvaluationStage
from domain.protocol import Metric, RolloutResponse
from domain.serverless_job import EVALUATION_CATEGORY, HUB_NAME, evaluation_defaults
from domain.trainer_job import PlayedStep, TrainingJob, print_step, read_dataset
from lambdas.pipeline.serverless_training import ManagedJobSettings, ServerlessTrainingCluster
from lambdas.router.conversations import ConversationStore
from local_trainer.checkpoints import FINAL, checkpoint_key, load_checkpoint, starting_policy
from local_trainer.loop import Trainer
from local_trainer.policy import Policy, policy_for
from local_trainer.policy_server import PolicyServer
from mtrl.local.job_runtime import JobRuntimeStandIn
from mtrl.local.waits import PlaneChanges
from reward_envs.registry import load

log = logging.getLogger("mtrl.managed_job")
# How long StopJob waits for a job's step in flight to end.
STOP_SECONDS = 30.0
# Where a trained model's package says its checkpoint is (its CustomerMetadataProperties).
CHECKPOINT_PROPERTY = "mtrl:checkpoint"
# An evaluation job's rollout timeout and concurrency: AWS's evaluation recipe's (the document
# does not set them).
EVALUATION_DEFAULTS = evaluation_defaults()


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def public_hub_model(name: str, region: str) -> dict[str, Any]:
    """DescribeHubContent's answer for model `name` of AWS's public hub (account `aws`), as a
    stand-in gives it: version 1.0.0, available, no document."""
    public = f"arn:aws:sagemaker:{region}:aws"
    return {
        "HubContentName": name, "HubContentVersion": "1.0.0", "HubContentType": "Model",
        "HubContentArn": f"{public}:hub-content/{HUB_NAME}/Model/{name}/1.0.0",
        "DocumentSchemaVersion": "2.4.0", "HubName": HUB_NAME, "HubArn": f"{public}:hub/{HUB_NAME}",
        "HubContentDocument": "{}", "HubContentStatus": "Available", "CreationTime": _now(),
    }  # fmt: skip


class RuntimeTurns(PolicyServer):
    """The policy being trained, answering the runtime's Sample calls: each turn's decision is
    kept, by trajectory, for the update that follows."""

    def start(self) -> None:
        """Nothing to poll: the runtime stand-in asks `sample` for each turn."""

    def sample(self, trajectory_id: str, request: dict[str, Any]) -> dict[str, Any]:
        """The OpenAI chat completion for the trajectory's next turn (a retried turn: the same)."""
        messages = request["messages"]
        step_id = f"{trajectory_id}_{sum(m.get('role') == 'assistant' for m in messages)}"
        decision = self.kept(trajectory_id, step_id)
        if decision is None:
            rng = np.random.default_rng([self.job.seed, zlib.crc32(step_id.encode())])
            decision = self.policy.decide(self.params, messages, rng)
            self.keep(trajectory_id, step_id, decision)
        token = {"token": decision.text, "logprob": decision.logprob}
        choice = {
            "index": 0, "message": decision.message, "finish_reason": "stop",
            "logprobs": {"content": [token]},
        }  # fmt: skip
        return {"object": "chat.completion", "choices": [choice]}


class AgentRollouts:
    """How a job of the service plays trajectories: each asked of the document's agent Lambda
    (Lambda's Invoke, the SDK's RolloutRequest), the run's workers answering its turns at the
    runtime and reporting it there. A trajectory failed, refused by the agent, or not reported
    within the timeout carries no reward."""

    def __init__(
        self,
        *,
        lambda_client: Any,
        runtime: JobRuntimeStandIn,
        job_arn: str,
        document: dict[str, Any],
        server: RuntimeTurns,
        timeout_seconds: float,
        clock: Callable[[], float],
    ) -> None:
        self.lambda_client, self.runtime, self.job_arn = lambda_client, runtime, job_arn
        self.agent = document["AgentConfig"]["CustomAgentLambdaConfig"]["LambdaArn"]
        self.server, self.timeout_seconds, self.clock = server, timeout_seconds, clock

    def play(self, records: dict[str, DatasetRecord]) -> dict[str, RolloutResponse]:
        """Each trajectory's record played; how each ended, by trajectory."""
        refused = {t for t, record in records.items() if not self._send(record, t)}
        self._await(set(records) - refused, until=self.clock() + self.timeout_seconds)
        return {t: self._response(t, refused=t in refused) for t in records}

    def _send(self, record: DatasetRecord, trajectory: str) -> bool:
        """The rollout request for one trajectory, to the agent Lambda; False if it refused."""
        request = AgentRolloutRequest(
            instance=record.model_dump(mode="json", exclude_none=True),
            metadata=RolloutMetadata(
                job_arn=self.job_arn, trajectory_id=trajectory, region=self.runtime.region,
                endpoint=runtime_endpoint(self.runtime.region),
            ),
        )  # fmt: skip
        answer = self.lambda_client.invoke(
            FunctionName=self.agent, Payload=request.model_dump_json(exclude_none=True)
        )
        if "FunctionError" in answer:
            log.warning("the agent refused trajectory %s: %s", trajectory,
                        answer["Payload"].read().decode(errors="replace"))  # fmt: skip
            return False
        return True

    def _await(self, trajectories: set[str], *, until: float) -> None:
        """Until every one of them is reported, the time is up, or the job stops."""
        with self.runtime.reported:
            while not self.server.stopped and not all(
                self.runtime.trajectory(self.job_arn, t).reported for t in trajectories
            ):
                left = until - self.clock()
                if left <= 0:
                    return
                self.runtime.reported.wait(timeout=left)

    def _response(self, trajectory: str, *, refused: bool) -> RolloutResponse:
        """How the trajectory ended, as a rollout response: its reward only if it has one."""
        played = self.runtime.trajectory(self.job_arn, trajectory)
        turns = [Metric(name="turns", value=float(len(played.turns)))]
        if played.rewarded:
            return RolloutResponse(
                sample_id=trajectory, stop_reason="end_of_conversation",
                rewards={"aggregate_score": float(sum(played.rewards))}, metrics=turns,
            )  # fmt: skip
        if refused or played.status == "failed":
            why = "the agent refused it" if refused else "its rollout failed"
            return RolloutResponse(
                sample_id=trajectory, stop_reason="env_error",
                rewards={"aggregate_score": None}, metrics=turns, error=why,
            )  # fmt: skip
        return RolloutResponse(
            sample_id=trajectory, stop_reason="timeout", rewards={"aggregate_score": None},
            metrics=turns, error="not reported within the rollout timeout",
        )  # fmt: skip

    def wake(self) -> None:
        """A job told to stop stops waiting for its trajectories."""
        with self.runtime.reported:
            self.runtime.reported.notify_all()


def _channel_records(s3: Any, document: dict[str, Any], channel: str) -> list[DatasetRecord]:
    """The records of the document's input channel `channel` (one of our dataset objects)."""
    (found,) = [c for c in document["InputDataConfig"] if c["ChannelName"] == channel]
    location = urlsplit(found["DataSource"]["S3DataSource"]["S3Uri"])
    return read_dataset(s3, bucket=location.netloc, key=location.path.lstrip("/"), version=None)


class ManagedJobTrainer(Trainer):
    def __init__(
        self,
        job: TrainingJob,
        *,
        s3: Any,
        lambda_client: Any,
        policy: Policy,
        runtime: JobRuntimeStandIn,
        job_arn: str,
        document: dict[str, Any],
        out: TextIO | None = None,
    ) -> None:
        self.runtime, self.job_arn, self.document = runtime, job_arn, document
        super().__init__(job, sqs=None, s3=s3, policy=policy, out=out)
        self.server: RuntimeTurns
        self.rollouts = AgentRollouts(
            lambda_client=lambda_client, runtime=runtime, job_arn=job_arn, document=document,
            server=self.server, timeout_seconds=self.config.rollout_timeout_seconds,
            clock=self.clock,
        )  # fmt: skip

    def _generation(self, params: np.ndarray) -> RuntimeTurns:
        return RuntimeTurns(
            self.job, sqs=None, policy=self.policy, params=params, version=self.steps_before
        )

    def _records(self) -> list[DatasetRecord]:
        """The train channel's records (the plane wrote them without the held-out ones)."""
        return _channel_records(self.s3, self.document, "train")

    def _publish(self, *, last: int) -> None:
        """The progress line only: the service's own figures go to MLflow, not to the run's
        metrics object, which the plane makes from the workers' reports."""
        print_step(self.history[-1], last=last, out=self.out)

    def stop(self) -> None:
        super().stop()
        self.rollouts.wake()

    def _step(self, step: int, records: list[DatasetRecord], rng: np.random.Generator) -> None:
        started, started_at = self.clock(), self.wall_clock()
        config = self.config
        wanted = config.global_batch_size // config.group_size
        chosen = rng.choice(len(records), size=wanted, replace=len(records) < wanted)
        groups = {
            f"{number}:{records[index].id}": [
                self.runtime.new_trajectory(self.job_arn) for _ in range(config.group_size)
            ]
            for number, index in enumerate(chosen)
        }
        trajectories = [t for group in groups.values() for t in group]
        self.server.record(trajectories)
        responses = self.rollouts.play(
            {
                trajectory: records[index]
                for group, index in zip(groups.values(), chosen, strict=True)
                for trajectory in group
            }
        )
        played = PlayedStep(groups, responses, started, started_at)
        self._update(step, played, self.server.recorded(trajectories))


class ManagedJobEvaluation:
    """An evaluation job (`AgentRFTEvaluation`) as the service runs one for its document: each
    record of its `evaluation` channel `eval_group_size` times through the agent, answered by the
    base model — the local policy a run starts from — or, with the document's
    InputModelPackageArn, by the trained model that package is (the local policy's checkpoint it
    names); nothing learned. Its results are the run's workers' reports: the service's own go to
    MLflow."""

    def __init__(
        self,
        job: TrainingJob,
        *,
        s3: Any,
        lambda_client: Any,
        registry: Any,
        policy: Policy,
        runtime: JobRuntimeStandIn,
        job_arn: str,
        document: dict[str, Any],
    ) -> None:
        self.job, self.s3, self.runtime, self.job_arn = job, s3, runtime, job_arn
        self.document = document
        params, version = self._model(registry, policy)
        self.server = RuntimeTurns(job, sqs=None, policy=policy, params=params, version=version)
        self.rollouts = AgentRollouts(
            lambda_client=lambda_client, runtime=runtime, job_arn=job_arn, document=document,
            server=self.server, timeout_seconds=float(EVALUATION_DEFAULTS["rollout_timeout"]),
            clock=time.monotonic,
        )  # fmt: skip

    def _model(self, registry: Any, policy: Policy) -> tuple[np.ndarray, int]:
        package = self.document.get("ModelPackageConfig", {}).get("InputModelPackageArn")
        if package is None:
            return starting_policy(self.s3, self.job, policy)
        described = registry.describe_model_package(ModelPackageName=package)
        bucket, _, key = (
            described["CustomerMetadataProperties"][CHECKPOINT_PROPERTY]
            .removeprefix("s3://")
            .partition("/")
        )
        return load_checkpoint(self.s3, bucket=bucket, key=key, policy=policy)

    def run(self) -> None:
        records = _channel_records(self.s3, self.document, "evaluation")
        chosen = self.document["EvaluationConfig"].get("HyperParameters", {})
        group = int(chosen.get("eval_group_size", EVALUATION_DEFAULTS["eval_group_size"]))
        planned = [(record, self.runtime.new_trajectory(self.job_arn)) for record in records
                   for _ in range(group)]  # fmt: skip
        self.server.record([trajectory for _, trajectory in planned])
        at_once = int(EVALUATION_DEFAULTS["rollout_max_concurrency"])
        for start in range(0, len(planned), at_once):
            if self.server.stopped:
                break
            self.rollouts.play({t: record for record, t in planned[start : start + at_once]})
        log.info("evaluated %d rollouts of %d records", len(planned), len(records))

    def stop(self) -> None:
        self.server.stop()
        self.rollouts.wake()


class ProgressLines:
    """The text stream a job's trainer prints its step lines on (the local trainer's stdout),
    kept as the entries they are; each told to `changes`."""

    def __init__(self, entries: list[dict[str, Any]], changes: PlaneChanges) -> None:
        self.entries, self._changes, self._buffer = entries, changes, ""

    def write(self, text: str) -> int:
        self._buffer += text
        while "\n" in self._buffer:
            line, _, self._buffer = self._buffer.partition("\n")
            if line.strip():
                self.entries.append(json.loads(line))
                self._changes.changed()
        return len(text)

    def flush(self) -> None:
        """Each line is kept as it is written."""


@dataclass
class _Job:
    description: dict[str, Any]
    document: dict[str, Any]  # the description's JobConfigDocument, as CreateJob sent it
    work: ManagedJobTrainer | ManagedJobEvaluation
    thread: threading.Thread | None = None
    stop_asked: bool = False
    package: str | None = None  # the trained model's, once registered


class LocalJobService:
    """The SageMaker calls of the serverless plane, answered here; use as a context manager (the
    runtime stand-in serves inside)."""

    def __init__(
        self,
        *,
        lambda_client: Any,
        s3: Any,
        sagemaker: Any,
        changes: PlaneChanges,
        seed: int = 0,
        region: str,
    ) -> None:
        """`sagemaker`: the model registry it registers trained models in; `changes`: told of
        each job's transitions and step lines."""
        self.lambda_client, self.s3, self.sagemaker, self.seed = lambda_client, s3, sagemaker, seed
        self._changes = changes
        self.model = botocore.session.get_session().get_service_model("sagemaker")
        self.runtime = JobRuntimeStandIn(self._sample, region=region)
        self.region = region
        self.runs: dict[str, RunContext] = {}  # by job name, told by the plane before CreateJob
        self.jobs: dict[str, _Job] = {}
        # Each run's step lines, as its job's trainer printed them (the local trainer's stdout).
        self.progress: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self._lock = threading.Lock()

    def __enter__(self) -> LocalJobService:
        self.runtime.__enter__()
        return self

    def __exit__(self, *_: object) -> None:
        self.kill_all()
        self.runtime.__exit__()

    @property
    def runtime_url(self) -> str:
        return self.runtime.url

    # --- the client calls -------------------------------------------------------------------

    def describe_hub_content(self, **request: Any) -> dict[str, Any]:
        self._check_request("DescribeHubContent", request)
        if request["HubName"] != HUB_NAME or request["HubContentType"] != "Model":
            self._refuse("DescribeHubContent", "ResourceNotFound", "no such hub content")
        return self._answer(
            "DescribeHubContent", public_hub_model(request["HubContentName"], self.region)
        )

    def create_job(self, **request: Any) -> dict[str, Any]:
        self._check_request("CreateJob", request)
        name = request["JobName"]
        with self._lock:
            if name in self.jobs:
                self._refuse("CreateJob", "ResourceInUse", f"Job {name} already exists")
            run = self.runs.get(name)
            if run is None:
                self._refuse("CreateJob", "ValidationException", f"no local run has job {name}")
            account = request["RoleArn"].split(":")[4]  # the job's account: its role's
            arn = f"arn:aws:sagemaker:{self.region}:{account}:job/{request['JobCategory']}/{name}"
            environment = load(run.training.environment, **run.training.environment_args)
            job = TrainingJob.for_run(
                run, seed=self.seed,
                reward_range=(environment.reward_range.low, environment.reward_range.high),
            )  # fmt: skip
            document = json.loads(request["JobConfigDocument"])
            played = dict(
                s3=self.s3, lambda_client=self.lambda_client, policy=policy_for(environment),
                runtime=self.runtime, job_arn=arn, document=document,
            )  # fmt: skip
            work = (
                ManagedJobEvaluation(job, registry=self.sagemaker, **played)
                if request["JobCategory"] == EVALUATION_CATEGORY
                else ManagedJobTrainer(
                    job, out=ProgressLines(self.progress[run.run_id], self._changes), **played
                )
            )
            now = _now()
            self.jobs[name] = managed = _Job(
                description={
                    "JobName": name, "JobArn": arn, "RoleArn": request["RoleArn"],
                    "JobCategory": request["JobCategory"],
                    "JobConfigSchemaVersion": request["JobConfigSchemaVersion"],
                    "JobConfigDocument": request["JobConfigDocument"],
                    "CreationTime": now, "LastModifiedTime": now, "JobStatus": "InProgress",
                    "SecondaryStatus": "Training",
                    "SecondaryStatusTransitions": [{"Status": "Training", "StartTime": now}],
                },
                document=document,
                work=work,
            )  # fmt: skip
            self.runtime.open_job(arn)
            managed.thread = threading.Thread(
                target=self._run, args=(managed,), name=f"job-{name}", daemon=True
            )
            managed.thread.start()
        return self._answer("CreateJob", {"JobArn": arn})

    def describe_job(self, **request: Any) -> dict[str, Any]:
        self._check_request("DescribeJob", request)
        job = self._job("DescribeJob", request)
        with self._lock:
            described = dict(job.description)
        described["JobConfigDocument"] = json.dumps(
            {**job.document, "ServiceOutput": self._service_output(job)}
        )
        return self._answer("DescribeJob", described)

    def _service_output(self, job: _Job) -> dict[str, Any]:
        """A training job's progress, and the package it registered once it completed (an
        evaluation's results go to MLflow only)."""
        if not isinstance(job.work, ManagedJobTrainer):
            return {}
        steps = [e for e in self.progress[job.work.job.run_id] if "step" in e]
        output: dict[str, Any] = {
            "ProgressInfo": {
                "MaxSteps": job.work.config.max_steps,
                "CurrentStep": steps[-1]["step"] if steps else 0,
            }
        }
        if job.package:
            output["OutputModelPackageArn"] = job.package
        return output

    def stop_job(self, **request: Any) -> dict[str, Any]:
        self._check_request("StopJob", request)
        job = self._job("StopJob", request)
        self._stop(job)
        return {}

    # --- the job ----------------------------------------------------------------------------

    def alive(self) -> int:
        return sum(1 for job in self.jobs.values() if job.thread and job.thread.is_alive())

    def kill_all(self) -> int:
        running = [job for job in self.jobs.values() if job.thread and job.thread.is_alive()]
        for job in running:
            self._stop(job)
        return len(running)

    def _stop(self, job: _Job) -> None:
        if job.thread is None or not job.thread.is_alive():
            return
        job.stop_asked = True
        self._transition(job, "Stopping", "Stopping")
        job.work.stop()
        job.thread.join(timeout=STOP_SECONDS)

    def _run(self, job: _Job) -> None:
        try:
            job.work.run()
        except Exception as error:  # noqa: BLE001 - a job that fails says why, as the service does
            log.exception("job %s failed", job.description["JobName"])
            self._transition(job, "Failed", "Failed", reason=f"{type(error).__name__}: {error}")
        else:
            if not job.stop_asked and isinstance(job.work, ManagedJobTrainer):
                job.package = self._register(job)
            final = "Stopped" if job.stop_asked else "Completed"
            self._transition(job, final, final)
        finally:
            self.runtime.close_job(job.description["JobArn"])

    def _register(self, job: _Job) -> str:
        """The trained model as a version in the document's output group, as the service
        registers it (the local policy's final checkpoint as its metadata)."""
        config = job.document["ModelPackageConfig"]
        group = config["OutputModelPackageGroupArn"].rsplit("/", 1)[-1]
        trained = job.work.job
        checkpoint = f"s3://{trained.bucket}/{checkpoint_key(trained.output_prefix, FINAL)}"
        return self.sagemaker.create_model_package(
            ModelPackageGroupName=group,
            ModelPackageDescription=f"{job.description['JobName']}: the local policy, trained",
            CustomerMetadataProperties={CHECKPOINT_PROPERTY: checkpoint},
        )["ModelPackageArn"]

    def _transition(self, job: _Job, status: str, secondary: str, *, reason: str = "") -> None:
        now = _now()
        with self._lock:
            description = job.description
            description |= {"JobStatus": status, "SecondaryStatus": secondary,
                            "LastModifiedTime": now}  # fmt: skip
            description["SecondaryStatusTransitions"].append(
                {"Status": secondary, "StartTime": now}
            )
            if status in ("Completed", "Failed", "Stopped"):
                description["EndTime"] = now
            if reason:
                description["FailureReason"] = reason[:1024]
        self._changes.changed()

    def _sample(self, job_arn: str, trajectory: str, request: dict[str, Any]) -> dict[str, Any]:
        return self.jobs[job_name_of(job_arn)].work.server.sample(trajectory, request)

    # --- botocore's model -------------------------------------------------------------------

    def _job(self, operation: str, request: dict[str, Any]) -> _Job:
        job = self.jobs.get(request["JobName"])
        if job is None or job.description["JobCategory"] != request["JobCategory"]:
            self._refuse(operation, "ResourceNotFound", f"Job {request['JobName']} not found")
        return job

    def _check_request(self, operation: str, request: dict[str, Any]) -> None:
        report = ParamValidator().validate(
            request, self.model.operation_model(operation).input_shape
        )
        if report.has_errors():
            raise ParamValidationError(report=report.generate_report())

    def _answer(self, operation: str, answer: dict[str, Any]) -> dict[str, Any]:
        shape = self.model.operation_model(operation).output_shape
        report = ParamValidator().validate(answer, shape)
        assert not report.has_errors(), f"{operation}: {report.generate_report()}"
        return answer

    def _refuse(self, operation: str, code: str, message: str) -> Any:
        known = {shape.name for shape in self.model.operation_model(operation).error_shapes}
        assert code in known | {"ValidationException"}, f"{operation} cannot answer {code}"
        raise ClientError({"Error": {"Code": code, "Message": message}}, operation)


class LocalServerlessPlane(ServerlessTrainingCluster):
    """The serverless plane over the local job service: it tells the service each run's context
    before the plane creates the run's job."""

    def __init__(
        self,
        settings: ManagedJobSettings,
        *,
        service: LocalJobService,
        s3: Any,
        store: ConversationStore,
    ) -> None:
        super().__init__(settings, sagemaker=service, s3=s3, store=store)
        self.service = service

    def submit(self, run: RunContext) -> str:
        self.service.runs[self.job(run)] = run
        return super().submit(run)

    def submit_evaluation(self, run: RunContext, *, stage: EvaluationStage) -> str:
        self.service.runs[self.job(run, stage)] = run
        return super().submit_evaluation(run, stage=stage)
