"""How a reward worker reports a trajectory of a SageMaker managed multi-turn RL job to the job's
runtime service (domain/agent_rft.py has the contract): completed with its rewards (one per
turn allowed), or failed — never a silent 0. As the SDK's client: a refusal saying the
trajectory had already ended (in its status line), or does not exist (404), is logged, not
raised; any other refusal is raised.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from http import HTTPStatus
from typing import Any

from botocore.credentials import Credentials

from domain.agent_rft import (
    COMPLETE_PATH,
    REWARD_PATH,
    Completion,
    RolloutMetadata,
    already_processed,
    bearer_token,
    completion_body,
    reward_body,
    runtime_endpoint,
)

log = logging.getLogger(__name__)
TIMEOUT_SECONDS = 120  # as the SDK's client waits


class FeedbackRefused(RuntimeError):
    """The runtime service refused a report."""


class RuntimeFeedback:
    def __init__(self, credentials: Callable[[], Credentials]) -> None:
        self._credentials = credentials

    def completed(self, metadata: RolloutMetadata, rewards: float | Sequence[float]) -> None:
        """The trajectory ended with these rewards (the episode's, or one per turn)."""
        self._report(metadata, "ready", [rewards] if isinstance(rewards, int | float) else rewards)

    def failed(self, metadata: RolloutMetadata, error: str) -> None:
        """The trajectory could not be played (`error` says why): failed, its reward 0.0."""
        log.error("trajectory %s failed: %s", metadata.trajectory_id, error)
        self._report(metadata, "failed", [0.0])

    def _report(
        self, metadata: RolloutMetadata, status: Completion, rewards: Sequence[float]
    ) -> None:
        self._post(metadata, COMPLETE_PATH, completion_body(metadata, status))
        self._post(metadata, REWARD_PATH, reward_body(metadata, rewards))

    def _post(self, metadata: RolloutMetadata, path: str, body: dict[str, Any]) -> None:
        token = bearer_token(self._credentials(), metadata.region)
        request = urllib.request.Request(
            runtime_endpoint(metadata) + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS):  # noqa: S310 - the job's service
                return
        except urllib.error.HTTPError as error:
            answer = error.read().decode(errors="replace")[:500]
            # As the SDK judges a refusal: by its status line (requests' error text), not body.
            if error.code == HTTPStatus.NOT_FOUND or already_processed(f"{error.reason}"):
                log.warning("%s %s: HTTP %s %s", path, metadata.trajectory_id, error.code, answer)
                return
            raise FeedbackRefused(f"{path}: HTTP {error.code} {error.reason}: {answer}") from None
