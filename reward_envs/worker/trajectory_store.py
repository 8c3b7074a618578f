"""The worker's side of the trajectory store: finished rollouts, batched into Parquet files.

`add` only appends to a buffer (no I/O on the rollout's thread); a writer thread encodes and
uploads a file when `flush_rows` rollouts wait, when the oldest has waited `flush_seconds`, and
on `close` (the worker's stop). Memory is bounded: past `max_buffered_bytes` waiting or being
uploaded (an upload that keeps failing or hangs), new rollouts are counted as dropped rather than
held — the trajectories are for
people reading them, training never waits on them. A failed upload is tried again at the next
flush, the rows kept.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from domain.trajectories import Trajectory, encode, hour_of, object_key

log = logging.getLogger("mtrl.trajectories")

# Uploads tried for what is left when the worker stops (each with boto3's own retries).
CLOSE_ATTEMPTS = 3
# Writes one object (key, Parquet bytes); S3's PutObject in the worker.
Put = Callable[[str, bytes], None]


def s3_put(s3: Any, bucket: str) -> Put:
    """Objects into the data bucket (its default encryption, the data key, applies)."""

    def put(key: str, body: bytes) -> None:
        s3.put_object(
            Bucket=bucket, Key=key, Body=body, ContentType="application/vnd.apache.parquet"
        )

    return put


@dataclass
class StoreStats:
    written: int = 0  # rollouts uploaded
    files: int = 0
    dropped: int = 0  # rollouts refused: the buffer was full
    failed_uploads: int = 0


class TrajectoryStore:
    def __init__(
        self,
        put: Put,
        *,
        prefix: str,
        writer: str | None = None,
        flush_rows: int = 256,
        flush_seconds: float = 30.0,
        max_buffered_bytes: int = 64 * 1024 * 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._put = put
        self._prefix = prefix
        self.writer = writer or uuid.uuid4().hex[:12]
        self._flush_rows = flush_rows
        self._flush_seconds = flush_seconds
        self._max_bytes = max_buffered_bytes
        self._clock = clock
        self._buffer: list[Trajectory] = []
        self._buffered_bytes = (
            0  # waiting, and being uploaded (`_in_flight`): what the bound counts
        )
        self._in_flight = 0
        self._oldest: float | None = None
        self._not_before = 0.0  # after a failed upload: not again before then
        self._files = 0
        self._closing = False
        self._wake = threading.Condition()
        self.stats = StoreStats()
        self._thread = threading.Thread(
            target=self._write_forever, name="trajectories", daemon=True
        )
        self._thread.start()

    def add(self, trajectory: Trajectory) -> bool:
        """Buffer a finished rollout; False when it was dropped (the buffer is full)."""
        with self._wake:
            if self._buffered_bytes + self._in_flight + trajectory.size > self._max_bytes:
                self.stats.dropped += 1
                if self.stats.dropped == 1 or self.stats.dropped % 100 == 0:
                    log.error(
                        "trajectory buffer full (%d bytes waiting to upload): %d rollouts dropped",
                        self._buffered_bytes,
                        self.stats.dropped,
                    )
                return False
            self._buffer.append(trajectory)
            self._buffered_bytes += trajectory.size
            if self._oldest is None:
                self._oldest = self._clock()
            if len(self._buffer) >= self._flush_rows:
                self._wake.notify()
            return True

    def close(self, timeout: float = 30.0) -> StoreStats:
        """Upload what is buffered and stop the writer thread."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        self._thread.join(timeout=timeout)
        return self.stats

    def _due(self) -> bool:
        if not self._buffer:
            return False
        if self._closing:
            return True
        if self._clock() < self._not_before:
            return False
        waited = self._clock() - (self._oldest if self._oldest is not None else self._clock())
        return len(self._buffer) >= self._flush_rows or waited >= self._flush_seconds

    def _write_forever(self) -> None:
        tries_at_close = 0
        while True:
            with self._wake:
                while not self._due() and not self._closing:
                    self._wake.wait(timeout=min(1.0, self._flush_seconds))
                if self._closing and not self._buffer:
                    return
                batch, self._in_flight = self._buffer, self._buffered_bytes
                self._buffer, self._buffered_bytes, self._oldest = [], 0, None
                closing = self._closing
            left = self._upload(batch)
            with self._wake:
                self._in_flight = 0
                if not left:
                    continue
                # Kept for the next flush, ahead of what came meanwhile.
                self._buffer = left + self._buffer
                self._buffered_bytes += sum(t.size for t in left)
                self._oldest = self._clock()
                self._not_before = self._clock() + min(self._flush_seconds, 5.0)
            tries_at_close += closing
            if tries_at_close == CLOSE_ATTEMPTS:
                log.error("%d trajectories not uploaded at stop", len(left))
                return

    def _upload(self, batch: list[Trajectory]) -> list[Trajectory]:
        """One file per hour of the batch; the trajectories whose upload failed."""
        by_hour: dict[str, list[Trajectory]] = defaultdict(list)
        for trajectory in batch:
            by_hour[hour_of(trajectory.finished_at)].append(trajectory)
        failed: list[Trajectory] = []
        for hour, rows in sorted(by_hour.items()):
            key = object_key(self._prefix, hour, self.writer, self._files)
            try:
                body = encode(rows)
            except Exception:  # noqa: BLE001 - rows the schema refuses would be refused again
                log.exception("%d trajectories cannot be written as Parquet: dropped", len(rows))
                with self._wake:
                    self.stats.dropped += len(rows)
                continue
            try:
                self._put(key, body)
            except Exception:  # noqa: BLE001 - kept and tried again at the next flush
                self.stats.failed_uploads += 1
                log.exception("uploading %d trajectories to %s failed", len(rows), key)
                failed += rows
                continue
            self._files += 1
            self.stats.files += 1
            self.stats.written += len(rows)
        return failed
