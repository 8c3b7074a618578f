"""A deployed run in the deployment's SageMaker managed MLflow tracking server, over MLflow's
REST API (no MLflow client in the Lambda package).

What AWS's own client plugin does (aws/sagemaker-mlflow 0a5f7d8, `mlflow_sagemaker_helpers.py`
`get_tracking_server_url`, `mlflow_sagemaker_request_header_provider.py`, `auth.py`): requests go
to `https://<region>.experiments.sagemaker.aws/api/2.0/mlflow/...`, name the tracking server in
the `x-mlflow-sm-tracking-server-arn` header, and are SigV4-signed for the service
`sagemaker-mlflow` with the body's SHA-256 in `X-Amz-Content-SHA256`. Each call is the IAM
action of its name (Service Authorization Reference, "Amazon SageMaker with MLflow":
`sagemaker-mlflow:CreateRun`, ... on the `mlflow-tracking-server` resource). The paths and
bodies are MLflow's (its `service.proto`: GetExperimentByName, CreateExperiment, CreateRun,
LogBatch, UpdateRun). Files go straight to the run's artifact URI in S3, as MLflow clients
put them (the server's artifact store: `mlflow/` in the data bucket).
"""

from __future__ import annotations

import hashlib
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import ReadOnlyCredentials

from domain.tracking import EXPERIMENT, TrackedRun

SERVICE = "sagemaker-mlflow"
ARN_HEADER = "x-mlflow-sm-tracking-server-arn"
TIMEOUT_SECONDS = 20


class TrackingFailed(RuntimeError):
    """The tracking server refused or did not answer; the message says which call and why."""


def server_endpoint(arn: str) -> str:
    region = arn.split(":")[3]
    return f"https://{region}.experiments.sagemaker.aws"


class MlflowServer:
    """The tracking server `arn`, with the caller's credentials (its role's)."""

    def __init__(
        self,
        arn: str,
        *,
        credentials: Callable[[], ReadOnlyCredentials],
        s3: Any,
        endpoint: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.arn = arn
        self._region = arn.split(":")[3]
        self._endpoint = (endpoint or server_endpoint(arn)).rstrip("/")
        self._credentials, self._s3, self._clock = credentials, s3, clock

    def log(self, run: TrackedRun) -> str:
        """The run as an MLflow run of the deployment's experiment; its MLflow run id."""
        experiment = self._experiment_id()
        created = self._call(
            "POST",
            "runs/create",
            {
                "experiment_id": experiment,
                "run_name": run.run_name,
                "start_time": int(self._clock() * 1000),
            },
        )["run"]["info"]
        run_id = created["run_id"]
        for metrics, params, tags in run.batches():
            self._call(
                "POST",
                "runs/log-batch",
                {
                    "run_id": run_id,
                    "metrics": [
                        {
                            "key": m.key,
                            "value": m.value,
                            "timestamp": m.timestamp_ms,
                            "step": m.step,
                        }
                        for m in metrics
                    ],
                    "params": [{"key": k, "value": v} for k, v in params.items()],
                    "tags": [{"key": k, "value": v} for k, v in tags.items()],
                },
            )
        self._put_artifacts(created["artifact_uri"], run.artifacts)
        self._call(
            "POST",
            "runs/update",
            {"run_id": run_id, "status": run.status, "end_time": int(self._clock() * 1000)},
        )
        return run_id

    def _experiment_id(self) -> str:
        try:
            found = self._call("GET", "experiments/get-by-name", {"experiment_name": EXPERIMENT})
            return found["experiment"]["experiment_id"]
        except _NotFound:
            return self._call("POST", "experiments/create", {"name": EXPERIMENT})["experiment_id"]

    def _put_artifacts(self, artifact_uri: str, artifacts: dict[str, bytes]) -> None:
        where = urllib.parse.urlsplit(artifact_uri)
        if where.scheme != "s3":
            raise TrackingFailed(f"artifact URI {artifact_uri} is not in S3")
        for name, content in artifacts.items():
            key = f"{where.path.strip('/')}/{name}"
            self._s3.put_object(Bucket=where.netloc, Key=key, Body=content)

    def _call(self, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        url = f"{self._endpoint}/api/2.0/mlflow/{path}"
        data = b""
        if method == "GET":
            url = f"{url}?{urllib.parse.urlencode(body)}"
        else:
            data = json.dumps(body).encode()
        headers = {
            "Content-Type": "application/json",
            ARN_HEADER: self.arn,
            "X-Amz-Content-SHA256": hashlib.sha256(data).hexdigest(),
        }
        signed = AWSRequest(method=method, url=url, data=data or None, headers=headers)
        SigV4Auth(self._credentials(), SERVICE, self._region).add_auth(signed)
        request = urllib.request.Request(
            url, data=data or None, headers=dict(signed.headers.items()), method=method
        )
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as answer:  # noqa: S310
                return json.loads(answer.read() or b"{}")
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")[:500]
            if error.code == 404 and "RESOURCE_DOES_NOT_EXIST" in detail:
                raise _NotFound(detail) from None
            raise TrackingFailed(f"MLflow {path}: HTTP {error.code}: {detail}") from None
        except (urllib.error.URLError, TimeoutError) as error:
            raise TrackingFailed(f"MLflow {path}: {error}") from None


class _NotFound(Exception):
    pass
