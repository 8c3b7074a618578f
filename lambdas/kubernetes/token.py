"""EKS bearer tokens, as `aws eks get-token` makes them.

A token is `k8s-aws-v1.` + the unpadded URL-safe base64 of a presigned STS GetCallerIdentity
URL whose signature covers the `x-k8s-aws-id` header (the cluster name). EKS calls that URL to
learn who is asking, then maps the IAM principal to Kubernetes permissions (access entries).
The URL is presigned for 60 seconds; `EksTokenSource` makes a new one before it runs out.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from typing import Any

from lambdas.clients import Clients

PREFIX = "k8s-aws-v1."
CLUSTER_HEADER = "x-k8s-aws-id"
LIFETIME_SECONDS = 60
REFRESH_MARGIN_SECONDS = 15


def eks_token(cluster_name: str, *, sts: Any) -> str:
    """A bearer token for `cluster_name`, signed with the credentials of the `sts` client
    (which must use the cluster's region: EKS checks the regional STS host)."""

    def add_cluster_header(request: Any, **_: Any) -> None:
        request.headers[CLUSTER_HEADER] = cluster_name

    sts.meta.events.register_first("before-sign.sts.GetCallerIdentity", add_cluster_header)
    try:
        url = sts.generate_presigned_url(
            "get_caller_identity", Params={}, ExpiresIn=LIFETIME_SECONDS, HttpMethod="GET"
        )
    finally:
        sts.meta.events.unregister("before-sign.sts.GetCallerIdentity", add_cluster_header)
    return PREFIX + base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")


class EksTokenSource:
    """The current token for one cluster, made again shortly before it expires."""

    def __init__(
        self,
        cluster_name: str,
        *,
        sts: Any,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`sts`: a client of the cluster's region (`regional_sts`)."""
        self._cluster = cluster_name
        self._sts = sts
        self._clock = clock
        self._token: str | None = None
        self._made_at = 0.0

    def __call__(self, *, fresh: bool = False) -> str:
        stale = self._clock() - self._made_at > LIFETIME_SECONDS - REFRESH_MARGIN_SECONDS
        if fresh or self._token is None or stale:
            self._token = eks_token(self._cluster, sts=self._sts)
            self._made_at = self._clock()
        return self._token


def regional_sts(clients: Clients, region: str) -> Any:
    """An STS client of `region`'s own endpoint: the host EKS expects in a token."""
    return clients("sts", region_name=region, endpoint_url=f"https://sts.{region}.amazonaws.com")
