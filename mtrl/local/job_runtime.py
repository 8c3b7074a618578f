"""A stand-in of SageMaker's job runtime service (`sagemakerjobruntime`, API 2026-02-01) for local
runs and tests: an HTTP server on 127.0.0.1 that AWS's own boto3 client talks to (its
`endpoint_url`). It answers the operations of botocore's model of the service, routed, read and
refused as that model says (paths, header and body members, each operation's own errors with
their HTTP status), and checks each call is SigV4-signed as `sagemaker` in its region.

What it does with a trajectory follows the SageMaker API reference: `Sample` adds a turn (the
job's policy answers the OpenAI-compatible request), `CompleteRollout` seals the trajectory
(`ready` or `failed`; "no further turns will be appended"), `UpdateReward` gives it its rewards
after that ("Call this operation after CompleteRollout"); a report repeated with its
`ClientToken` answers as the first time did. Unverified, and chosen as the narrowest reading:
a turn after the seal is a ValidationException, a second report with another token a
ConflictException, a reward list of neither one value nor one per turn a ValidationException.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any, Literal

import botocore.session
from botocore.model import OperationModel

from mtrl.local.loopback import LoopbackHttpServer

SERVICE = "sagemakerjobruntime"
# The job's policy: (job ARN, trajectory id, OpenAI chat request) → OpenAI chat completion.
Policy = Callable[[str, str, dict[str, Any]], dict[str, Any]]


class Refused(Exception):
    """An answer the service's model names for the operation: the error and its message."""

    def __init__(self, error: str, message: str) -> None:
        super().__init__(message)
        self.error = error


@dataclass
class Trajectory:
    job_arn: str
    trajectory_id: str
    turns: list[dict[str, Any]] = field(default_factory=list)  # {"request", "completion"}
    status: Literal["open", "ready", "failed"] = "open"
    rewards: list[float] | None = None
    # What each report was first sent with, by its ClientToken.
    reports: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def rewarded(self) -> bool:
        """Sealed ready, with its rewards."""
        return self.status == "ready" and self.rewards is not None

    @property
    def reported(self) -> bool:
        """Nothing more will come of it: rewarded, or failed."""
        return self.rewarded or self.status == "failed"


class JobRuntimeStandIn:
    """The runtime service of the jobs opened on it. Use as a context manager: it serves on
    127.0.0.1 inside, and stops on leaving."""

    def __init__(self, policy: Policy, *, region: str = "us-east-1") -> None:
        self.policy, self.region = policy, region
        self.model = botocore.session.get_session().get_service_model(SERVICE)
        self.routes = {
            (op.http["method"], op.http["requestUri"]): op
            for op in map(self.model.operation_model, self.model.operation_names)
        }
        self.jobs: set[str] = set()
        self.trajectories: dict[tuple[str, str], Trajectory] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        # Notified whenever a trajectory is reported (its completion, its rewards).
        self.reported = threading.Condition(self._lock)
        self._server: LoopbackHttpServer | None = None

    # --- what the service's training side does -------------------------------------------------

    def open_job(self, job_arn: str) -> None:
        self.jobs.add(job_arn)

    def close_job(self, job_arn: str) -> None:
        self.jobs.discard(job_arn)

    def new_trajectory(self, job_arn: str) -> str:
        """A trajectory of the job, as the service makes one for each rollout request it sends."""
        with self._lock:
            trajectory_id = f"trajectory-{next(self._ids):06d}"
            self.trajectories[job_arn, trajectory_id] = Trajectory(job_arn, trajectory_id)
        return trajectory_id

    def trajectory(self, job_arn: str, trajectory_id: str) -> Trajectory:
        return self.trajectories[job_arn, trajectory_id]

    # --- serving ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._server is not None, "not serving"
        return self._server.url

    def __enter__(self) -> JobRuntimeStandIn:
        stand_in = self
        handler = type("JobRuntimeHandler", (_Handler,), {"stand_in": stand_in})
        self._server = LoopbackHttpServer(handler, name="job-runtime").__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.__exit__(*exc)

    def answer(
        self, operation: OperationModel, headers: dict[str, str], body: bytes
    ) -> tuple[dict[str, str], bytes]:
        """The operation's answer (headers, body); Refused with one of its modeled errors."""
        parameters = self._read(operation, headers, body)
        job_arn = parameters["JobArn"]
        if job_arn not in self.jobs:
            raise Refused("ResourceNotFoundException", f"job {job_arn} is not running")
        with self._lock:
            found = self.trajectories.get((job_arn, parameters["TrajectoryId"]))
        if found is None:
            raise Refused(
                "ResourceNotFoundException", f"no trajectory {parameters['TrajectoryId']}"
            )
        handle = getattr(self, f"_{operation.name}")
        return handle(found, parameters)

    def _read(
        self, operation: OperationModel, headers: dict[str, str], body: bytes
    ) -> dict[str, Any]:
        shape = operation.input_shape
        payload = shape.serialization.get("payload")
        parameters: dict[str, Any] = {}
        if payload:
            parameters[payload] = body
        elif body:
            try:
                parameters |= json.loads(body)
            except json.JSONDecodeError:
                raise Refused("ValidationException", "the body is not JSON") from None
        for name, member in shape.members.items():
            if member.serialization.get("location") == "header":
                value = headers.get(member.serialization["name"].lower())
                if value is not None:
                    parameters[name] = value
        missing = [name for name in shape.required_members if not parameters.get(name)]
        if missing:
            raise Refused("ValidationException", f"missing {', '.join(missing)}")
        pattern = shape.members["JobArn"].metadata.get("pattern")
        if pattern and not re.fullmatch(pattern, parameters["JobArn"]):
            raise Refused("ValidationException", f"JobArn {parameters['JobArn']} is not a job ARN")
        return parameters

    def _Sample(
        self, trajectory: Trajectory, parameters: dict[str, Any]
    ) -> tuple[dict[str, str], bytes]:  # noqa: N802 - the operation's name
        if trajectory.status != "open":
            raise Refused(
                "ValidationException", f"trajectory {trajectory.trajectory_id} is complete"
            )
        try:
            request = json.loads(parameters["Body"])
        except json.JSONDecodeError:
            raise Refused(
                "ValidationException", "Body is not an OpenAI-compatible request"
            ) from None
        try:
            completion = self.policy(trajectory.job_arn, trajectory.trajectory_id, request)
        except Exception as error:  # noqa: BLE001 - the policy failing is the service's error
            raise Refused("InternalServiceError", f"the policy failed: {error}") from error
        with self._lock:
            trajectory.turns.append({"request": request, "completion": completion})
        return {"Content-Type": "application/json"}, json.dumps(completion).encode()

    def _CompleteRollout(
        self, trajectory: Trajectory, parameters: dict[str, Any]
    ) -> tuple[dict[str, str], bytes]:  # noqa: N802
        status = parameters.get("Status", "ready")
        if status not in ("ready", "failed"):
            raise Refused("ValidationException", f"Status {status} is not ready or failed")
        with self._lock:
            if self._taken(trajectory, parameters):
                return {}, b"{}"
            if trajectory.status != "open":
                raise Refused(
                    "ConflictException", f"Cannot transition trajectory from {trajectory.status}"
                )
            trajectory.status = status
            self._remember(trajectory, parameters)
        return {}, b"{}"

    def _UpdateReward(
        self, trajectory: Trajectory, parameters: dict[str, Any]
    ) -> tuple[dict[str, str], bytes]:  # noqa: N802
        rewards = parameters["Rewards"]
        if not isinstance(rewards, list) or not all(isinstance(r, int | float) for r in rewards):
            raise Refused("ValidationException", "Rewards is not a list of numbers")
        with self._lock:
            if self._taken(trajectory, parameters):
                return {}, b"{}"
            if trajectory.status == "open":
                raise Refused("ConflictException", "CompleteRollout comes first")
            if trajectory.rewards is not None:
                raise Refused("ConflictException", "the trajectory has its rewards")
            if len(rewards) not in {1, len(trajectory.turns)}:
                raise Refused("ValidationException",
                              f"{len(rewards)} rewards for {len(trajectory.turns)} turns")  # fmt: skip
            trajectory.rewards = [float(reward) for reward in rewards]
            self._remember(trajectory, parameters)
        return {}, b"{}"

    @staticmethod
    def _taken(trajectory: Trajectory, parameters: dict[str, Any]) -> bool:
        """Whether this report was taken before under its ClientToken (then it is answered as
        it was); the same token with other parameters is refused."""
        token = parameters.get("ClientToken")
        if not token or token not in trajectory.reports:
            return False
        if trajectory.reports[token] != parameters:
            raise Refused("ValidationException", "ClientToken reused with other parameters")
        return True

    def _remember(self, trajectory: Trajectory, parameters: dict[str, Any]) -> None:
        """A report taken (under the lock): kept by its token, and told to those waiting."""
        if token := parameters.get("ClientToken"):
            trajectory.reports[token] = parameters
        self.reported.notify_all()


class _Handler(BaseHTTPRequestHandler):
    stand_in: JobRuntimeStandIn

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        stand_in = self.stand_in
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        operation = stand_in.routes.get(("POST", self.path))
        if operation is None:
            self._send(404, {"x-amzn-ErrorType": "UnknownOperationException"}, b"{}")
            return
        headers = {key.lower(): value for key, value in self.headers.items()}
        try:
            self._check_signature(headers.get("authorization", ""))
            answer_headers, answer = stand_in.answer(operation, headers, body)
        except Refused as refused:
            self._refuse(operation, refused)
            return
        self._send(200, answer_headers, answer)

    def _check_signature(self, authorization: str) -> None:
        scope = f"/{self.stand_in.region}/sagemaker/aws4_request"
        if not (
            authorization.startswith("AWS4-HMAC-SHA256 Credential=") and scope in authorization
        ):
            raise Refused(
                "AccessDeniedException",
                f"not signed with SigV4 for sagemaker in {self.stand_in.region}",
            )

    def _refuse(self, operation: OperationModel, refused: Refused) -> None:
        (shape,) = [error for error in operation.error_shapes if error.name == refused.error]
        status = shape.metadata["error"]["httpStatusCode"]
        body = json.dumps({"Message": str(refused)}).encode()
        self._send(
            status, {"x-amzn-ErrorType": refused.error, "Content-Type": "application/json"}, body
        )

    def _send(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        return
