"""A small Kubernetes API client over HTTPS: apply, get, list, delete — what the pipeline needs.

Plain HTTPS (urllib, the cluster's CA) keeps the Lambda package small and kubectl out of the
critical path. `apply` is server-side apply (`application/apply-patch+yaml`, one field manager,
forced): creating an object that exists changes nothing but what we own, so resubmitting a run
never creates a second job. A 401 makes the token source mint a new token and the call is tried
once more. API errors raise `KubernetesError` with the API's status, reason and message.
"""

from __future__ import annotations

import base64
import json
import ssl
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from domain.kubernetes_kinds import kind_of

FIELD_MANAGER = "nova-mtrl"
TokenSource = Callable[..., str]


class KubernetesError(RuntimeError):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"Kubernetes API {status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message


class KubernetesClient:
    def __init__(
        self,
        endpoint: str,
        *,
        token: TokenSource,
        certificate_authority: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        """`certificate_authority`: the cluster's CA bundle, base64 of PEM, as EKS describes it."""
        self._endpoint = endpoint.rstrip("/")
        self._token = token
        self._timeout = timeout
        self._context = ssl.create_default_context()
        if certificate_authority:
            with tempfile.NamedTemporaryFile("wb", suffix=".pem") as bundle:
                bundle.write(base64.b64decode(certificate_authority))
                bundle.flush()
                self._context = ssl.create_default_context(cafile=bundle.name)

    @classmethod
    def for_eks(cls, eks: Any, cluster_name: str, *, token: TokenSource) -> KubernetesClient:
        """Endpoint and CA from `eks.describe_cluster`."""
        cluster = eks.describe_cluster(name=cluster_name)["cluster"]
        return cls(
            cluster["endpoint"],
            token=token,
            certificate_authority=cluster["certificateAuthority"]["data"],
        )

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or update `obj` (server-side apply); returns the object as stored."""
        kind = kind_of(obj["apiVersion"], obj["kind"])
        metadata = obj["metadata"]
        path = kind.path(metadata.get("namespace"), metadata["name"])
        query = urlencode({"fieldManager": FIELD_MANAGER, "force": "true"})
        return self._call(
            "PATCH", f"{path}?{query}", obj, content_type="application/apply-patch+yaml"
        )

    def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        try:
            return self._call("GET", kind_of(api_version, kind).path(namespace, name))
        except KubernetesError as error:
            if error.status == 404:
                return None
            raise

    def list(
        self,
        api_version: str,
        kind: str,
        *,
        namespace: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> list[dict[str, Any]]:
        path = kind_of(api_version, kind).path(namespace)
        if labels:
            selector = ",".join(f"{key}={value}" for key, value in sorted(labels.items()))
            path += "?" + urlencode({"labelSelector": selector})
        return self._call("GET", path).get("items", [])

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> bool:
        """Delete (dependents in the foreground); False when it was already gone."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground"}
        try:
            self._call("DELETE", kind_of(api_version, kind).path(namespace, name), body)
        except KubernetesError as error:
            if error.status == 404:
                return False
            raise
        return True

    def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        for attempt in (1, 2):
            request = urllib.request.Request(
                self._endpoint + path,
                data=json.dumps(body).encode() if body is not None else None,
                method=method,
                headers={
                    "Authorization": f"Bearer {self._token(fresh=attempt == 2)}",
                    "Accept": "application/json",
                    "Content-Type": content_type,
                },
            )
            try:
                with urllib.request.urlopen(  # noqa: S310 - the cluster's endpoint
                    request, timeout=self._timeout, context=self._context
                ) as response:
                    return json.loads(response.read() or b"{}")
            except urllib.error.HTTPError as error:
                if error.code == 401 and attempt == 1:
                    continue  # an expired token: mint a new one, once
                raise _api_error(error) from None
        raise AssertionError("unreachable")


def _api_error(error: urllib.error.HTTPError) -> KubernetesError:
    try:
        status = json.loads(error.read() or b"{}")
    except json.JSONDecodeError:
        status = {}
    return KubernetesError(
        error.code,
        status.get("reason") or error.reason or "Error",
        status.get("message") or f"{error.code} from the Kubernetes API",
    )
