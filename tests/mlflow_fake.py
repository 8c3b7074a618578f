"""A SageMaker managed MLflow tracking server on loopback, for the tests: MLflow's REST API as
MLflow defines it, behind what AWS's client plugin (aws/sagemaker-mlflow) shows of the managed
server's front.

- Routes, request and answer shapes come from MLflow's own `service.proto` (the
  `mlflow.protos.service_pb2` descriptors: each method's `mlflow.rpc` endpoint, its request
  message, its `Response`): a body with a field MLflow does not define is refused, an answer
  carries only fields MLflow defines.
- Every request must name the server in `x-mlflow-sm-tracking-server-arn` and carry a valid
  SigV4 signature for the service `sagemaker-mlflow` (checked with the caller's secret).
- Each accepted request is reported as the IAM action of its name (`on_call(access_key,
  "CreateRun", arn)`), for the IAM proof.
Implemented: the experiments and runs calls a tracker makes; others answer 501.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from google.protobuf import json_format, message_factory
from mlflow.exceptions import MlflowException
from mlflow.protos import service_pb2
from mlflow.protos.databricks_pb2 import rpc
from mlflow.utils.validation import _validate_batch_log_limits

from mtrl.local.loopback import LoopbackHttpServer
from tests.json_http import send_json

SERVICE = "sagemaker-mlflow"
ARN_HEADER = "x-mlflow-sm-tracking-server-arn"
_AUTH = re.compile(
    r"AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<date>\d+)/(?P<region>[^/]+)/"
    r"(?P<service>[^/]+)/aws4_request, SignedHeaders=(?P<signed>[^,]+), Signature=(?P<sig>\w+)"
)


def _routes() -> dict[tuple[str, str], tuple[str, Any]]:
    """(HTTP method, path) -> (the rpc's name, its request message class), from service.proto."""
    routes = {}
    for method in service_pb2.MlflowService.DESCRIPTOR.methods:
        options = method.GetOptions().Extensions[rpc]
        message = message_factory.GetMessageClass(method.input_type)
        for endpoint in options.endpoints:
            if endpoint.since.major == 2:
                routes[(endpoint.method, f"/api/2.0{endpoint.path}")] = (method.name, message)
    return routes


ROUTES = _routes()


class FakeMlflowServer:
    def __init__(
        self,
        arn: str,
        *,
        secret_of: Callable[[str], str | None],
        artifact_root: str,
        on_call: Callable[[str, str, str], None] = lambda *_: None,
    ) -> None:
        self.arn, self.artifact_root = arn, artifact_root.rstrip("/")
        self._secret_of, self._on_call = secret_of, on_call
        self.experiments: dict[str, dict[str, Any]] = {}
        self.runs: dict[str, dict[str, Any]] = {}
        self.refused: list[str] = []
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the HTTP verb
                fake._serve(self, "GET")

            def do_POST(self) -> None:  # noqa: N802
                fake._serve(self, "POST")

            def log_message(self, *args: object) -> None:
                pass

        self._server = LoopbackHttpServer(Handler, name="fake-mlflow")
        self.url = self._server.url

    def __enter__(self) -> FakeMlflowServer:
        self._server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.__exit__(*exc)

    # --- the front: who asks, for which server ---

    def _serve(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        split = urlsplit(handler.path)
        body = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        route = ROUTES.get((method, split.path))
        if route is None:
            return self._answer(handler, 404, {"error_code": "ENDPOINT_NOT_FOUND"})
        key, problem = self._signer(handler, method, body)
        if problem or handler.headers.get(ARN_HEADER) != self.arn:
            self.refused.append(problem or f"{ARN_HEADER}: {handler.headers.get(ARN_HEADER)}")
            return self._answer(handler, 403, {"message": problem or "unknown tracking server"})
        name, message = route
        request = message()
        try:
            if method == "GET":
                fields = {k: v[0] for k, v in parse_qs(split.query).items()}
                json_format.ParseDict(fields, request)
            else:
                json_format.Parse(body or b"{}", request)
        except json_format.ParseError as error:
            return self._answer(handler, 400, {"error_code": "INVALID_PARAMETER_VALUE", "message": str(error)})  # fmt: skip
        action = name[0].upper() + name[1:]
        self._on_call(key, action, self.arn)
        status, answer = self._handle(action, request)
        if status == 200:
            response = message_factory.GetMessageClass(
                message.DESCRIPTOR.nested_types_by_name["Response"]
            )()
            answer = json_format.MessageToDict(
                json_format.ParseDict(answer, response), preserving_proto_field_name=True
            )
        return self._answer(handler, status, answer)

    def _signer(
        self, handler: BaseHTTPRequestHandler, method: str, body: bytes
    ) -> tuple[str, str | None]:
        """The caller's access key, and what is wrong with the signature (None: valid)."""
        found = _AUTH.fullmatch(handler.headers.get("Authorization", ""))
        if found is None:
            return "", "no SigV4 Authorization header"
        if found["service"] != SERVICE:
            return found["key"], f"signed for {found['service']}, not {SERVICE}"
        secret = self._secret_of(found["key"])
        if secret is None:
            return found["key"], f"unknown access key {found['key']}"
        signed = found["signed"].split(";")
        headers = {name: handler.headers[name] for name in signed if name in handler.headers}
        host = handler.headers["Host"]
        request = AWSRequest(method=method, url=f"http://{host}{handler.path}", data=body or None, headers=headers)  # fmt: skip
        request.context["timestamp"] = handler.headers["X-Amz-Date"]
        token = handler.headers.get("X-Amz-Security-Token")
        auth = SigV4Auth(Credentials(found["key"], secret, token), SERVICE, found["region"])
        expected = auth.signature(auth.string_to_sign(request, auth.canonical_request(request)), request)  # fmt: skip
        return found["key"], None if expected == found["sig"] else "signature does not match"

    @staticmethod
    def _answer(handler: BaseHTTPRequestHandler, status: int, answer: dict[str, Any]) -> None:
        send_json(handler, status, answer)

    # --- MLflow: the experiments and runs a tracker uses ---

    def _handle(self, action: str, request: Any) -> tuple[int, dict[str, Any]]:
        with self._lock:
            match action:
                case "GetExperimentByName":
                    for experiment in self.experiments.values():
                        if experiment["name"] == request.experiment_name:
                            return 200, {"experiment": experiment}
                    return 404, {"error_code": "RESOURCE_DOES_NOT_EXIST",
                                 "message": f"experiment {request.experiment_name!r} not found"}  # fmt: skip
                case "CreateExperiment":
                    number = str(len(self.experiments) + 1)
                    self.experiments[number] = {
                        "experiment_id": number, "name": request.name,
                        "artifact_location": f"{self.artifact_root}/{number}",
                        "lifecycle_stage": "active",
                    }  # fmt: skip
                    return 200, {"experiment_id": number}
                case "CreateRun":
                    experiment = self.experiments[request.experiment_id]
                    run_id = uuid.uuid4().hex
                    info = {
                        "run_id": run_id, "experiment_id": request.experiment_id,
                        "run_name": request.run_name, "status": "RUNNING",
                        "start_time": request.start_time, "lifecycle_stage": "active",
                        "artifact_uri": f"{experiment['artifact_location']}/{run_id}/artifacts",
                    }  # fmt: skip
                    self.runs[run_id] = {"info": info, "metrics": [], "params": {}, "tags": {}}
                    return 200, {"run": {"info": info, "data": {}}}
                case "LogBatch":
                    # What MLflow's own server refuses of a batch, by its own rule.
                    try:
                        _validate_batch_log_limits(request.metrics, request.params, request.tags)
                    except MlflowException as refused:
                        return 400, {"error_code": refused.error_code, "message": refused.message}
                    run = self.runs[request.run_id]
                    run["metrics"] += [
                        (m.key, m.value, m.step, m.timestamp) for m in request.metrics
                    ]
                    run["params"] |= {p.key: p.value for p in request.params}
                    run["tags"] |= {t.key: t.value for t in request.tags}
                    return 200, {}
                case "UpdateRun":
                    info = self.runs[request.run_id]["info"]
                    info |= {"status": service_pb2.RunStatus.Name(request.status),
                             "end_time": request.end_time}  # fmt: skip
                    return 200, {"run_info": info}
        return 501, {"error_code": "NOT_IMPLEMENTED", "message": f"{action} is not faked"}
