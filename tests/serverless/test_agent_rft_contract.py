"""The managed multi-turn RL runtime contract (domain/agent_rft.py, and the worker's reports,
reward_envs/worker/runtime_feedback.py) against the SageMaker SDK's own functions
(sagemaker-train 1.27.0's `sagemaker/train/rft/`, sagemaker-core 2.27.0's token generator,
loaded from source by tests/sagemaker_train_sdk.py): the same requests accepted, the same
headers, the same bearer token, the same reports on the wire, the same refusals tolerated."""

from __future__ import annotations

import datetime
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from botocore.credentials import Credentials
from pydantic import ValidationError

from domain.agent_rft import (
    AgentRolloutRequest,
    RolloutMetadata,
    bearer_token,
    inference_headers,
)
from reward_envs.worker.runtime_feedback import FeedbackRefused, RuntimeFeedback
from tests.sagemaker_train_sdk import rft_feedback, rft_headers, rft_models, token_generator

CREDENTIALS = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG", "session-token")
METADATA = {
    "job_arn": "arn:aws:sagemaker:us-west-2:123456789012:job/agent-rft-1",
    "trajectory_id": "traj-0007",
    "endpoint": "https://job-runtime.sagemaker.us-west-2.api.aws",
    "region": "us-west-2",
}
NOW = datetime.datetime(2026, 12, 6, 12, 0, 0, tzinfo=datetime.UTC)


@pytest.mark.parametrize(
    "payload",
    [
        {"instance": {"prompt": "Guess."}, "metadata": METADATA},
        {"instance": {}, "metadata": {k: v for k, v in METADATA.items() if k != "region"}},
        {
            "instance": {"a": 1},
            "metadata": METADATA,
            "inference_params": {"temperature": 0.7},
            "model_name": "nova",
            "model_endpoint": "https://m",
            "extra": "ignored",
        },  # fmt: skip
        {"instance": {"a": 1}, "metadata": METADATA, "inference_params": {"max_tokens": "64"}},
        {"instance": {"a": 1}, "metadata": METADATA, "inference_params": {"max_tokens": "many"}},
        {"instance": {"a": 1}, "metadata": {**METADATA, "trajectory_id": None}},
        {"instance": "not an object", "metadata": METADATA},
        {"metadata": METADATA},
        {"instance": {}, "metadata": {"job_arn": "j", "trajectory_id": "t"}},
    ],
)
def test_a_rollout_request_is_read_as_the_sdks_model_reads_it(payload: dict[str, Any]) -> None:
    try:
        theirs: Any = rft_models().RolloutRequest.model_validate(payload).model_dump()
    except ValidationError:
        theirs = "refused"
    try:
        ours: Any = AgentRolloutRequest.model_validate(payload).model_dump()
    except ValidationError:
        ours = "refused"
    assert ours == theirs


def test_the_inference_headers_are_the_sdks() -> None:
    for metadata in (METADATA, {**METADATA, "job_arn": ""}):
        ours = inference_headers(RolloutMetadata.model_validate(metadata))
        assert ours == rft_headers().make_inference_headers(metadata)
    assert set(ours) == {"X-Amzn-SageMaker-Trajectory-Id"}  # an empty ARN is left out


def test_the_bearer_token_is_the_sdks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Signed at the same instant with the same credentials: the same token, byte for byte."""
    monkeypatch.setattr("botocore.auth.get_current_datetime", lambda: NOW)
    theirs = token_generator()._generate_token(CREDENTIALS, "us-west-2", 43200)
    assert bearer_token(CREDENTIALS, "us-west-2") == theirs
    assert theirs.startswith("sagemaker-api-key-")
    assert bearer_token(CREDENTIALS, "us-east-1") != theirs  # the region is signed


class _Runtime(BaseHTTPRequestHandler):
    """The runtime service's two report paths: records each request, answers `status`."""

    received: list[tuple[str, dict[str, Any], str]]
    status: tuple[int, str] = (200, "OK")

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.received.append((self.path, body, self.headers["Authorization"]))
        code, reason = self.status
        self.send_response(code, reason)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *_: Any) -> None:
        return


@contextmanager
def runtime_service(status: tuple[int, str] = (200, "OK")) -> Iterator[type[_Runtime]]:
    handler = type("Runtime", (_Runtime,), {"received": [], "status": status})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    handler.url = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    try:
        yield handler
    finally:
        server.shutdown()
        thread.join(timeout=5)


@pytest.fixture
def signed_now(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both clients sign at the same instant with the same credentials (the SDK's from the
    environment, ours given)."""
    monkeypatch.setattr("botocore.auth.get_current_datetime", lambda: NOW)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", CREDENTIALS.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", CREDENTIALS.secret_key)
    monkeypatch.setenv("AWS_SESSION_TOKEN", CREDENTIALS.token)


def _both(status: tuple[int, str], ours: Any, theirs: Any) -> tuple[Any, Any]:
    """What each client sent (or raised) for the same report, against the same service."""
    sent = []
    for report in (ours, theirs):
        with runtime_service(status) as service:
            metadata = {**METADATA, "endpoint": service.url}  # type: ignore[attr-defined]
            try:
                report(metadata)
                outcome: Any = "reported"
            except Exception as error:  # noqa: BLE001 - which side raises is the point
                outcome = f"raised {type(error).__name__}"
            sent.append((service.received, outcome))
    return sent[0], sent[1]


def ours_client() -> RuntimeFeedback:
    return RuntimeFeedback(lambda: CREDENTIALS)


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (
            lambda m: ours_client().completed(RolloutMetadata.model_validate(m), 0.75),
            lambda m: rft_feedback().RolloutFeedbackClient(m).report_complete(0.75),
        ),
        (
            lambda m: ours_client().completed(RolloutMetadata.model_validate(m), [0.0, 1, 0.5]),
            lambda m: (
                (client := rft_feedback().RolloutFeedbackClient(m)).complete_rollout(),
                client.update_reward([0.0, 1, 0.5]),
            ),
        ),
        (
            lambda m: ours_client().failed(RolloutMetadata.model_validate(m), "env down"),
            lambda m: rft_feedback().RolloutFeedbackClient(m).report_error("env down"),
        ),
    ],
    ids=["one reward", "a reward per turn", "failed"],
)
@pytest.mark.parametrize(
    "status",
    [
        (200, "OK"),
        (404, "Not Found"),
        (400, "Cannot transition trajectory"),
        (400, "Bad Request"),
        (500, "Internal Server Error"),
    ],  # fmt: skip
)
@pytest.mark.usefixtures("signed_now")
def test_the_reports_on_the_wire_and_the_refusals_tolerated_are_the_sdks(
    ours: Any, theirs: Any, status: tuple[int, str]
) -> None:
    """The paths, bodies and bearer tokens in order; a 404 or an already-ended trajectory
    tolerated, any other refusal raised (ours FeedbackRefused, theirs requests' HTTPError)."""
    (our_requests, our_outcome), (their_requests, their_outcome) = _both(status, ours, theirs)
    assert our_requests == their_requests and our_requests
    assert (our_outcome == "reported") == (their_outcome == "reported")
    if our_outcome != "reported":
        assert our_outcome == f"raised {FeedbackRefused.__name__}"


def test_botocores_model_of_the_runtime_service_is_as_the_readme_says() -> None:
    """botocore's own model of the runtime service (`sagemakerjobruntime`, API 2026-02-01), which
    the README sets beside the SDK's client as unverified: where each call goes, where the job
    ARN travels, how it is signed, the statuses a completion takes."""
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemakerjobruntime")
    assert (model.api_version, model.signing_name) == ("2026-02-01", "sagemaker")
    paths = {name: model.operation_model(name).http["requestUri"] for name in model.operation_names}
    assert paths == {
        "CompleteRollout": "/complete-rollout", "UpdateReward": "/update-reward",
        "Sample": "/sample", "SampleWithResponseStream": "/sample-with-response-stream",
    }  # fmt: skip
    complete = model.operation_model("CompleteRollout").input_shape.members
    assert complete["JobArn"].serialization == {
        "location": "header", "name": "X-Amzn-SageMaker-Job-Arn",
    }  # fmt: skip
    assert complete["Status"].enum == ["ready", "failed"]
    assert complete["ClientToken"].metadata == {"idempotencyToken": True}
    sample = model.operation_model("Sample").input_shape.members
    assert sample["TrajectoryId"].serialization["name"] == "X-Amzn-SageMaker-Trajectory-Id"
