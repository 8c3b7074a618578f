"""What the trajectory store costs a rollout (issue #22's closing figure): rollout latency p50/p99
and the worker's memory with the store off and on, side by side, on the same requests.

The whole worker loop runs as on AWS: moto's server (its own process) for SQS and S3, 16
episodes at once, a model that takes `MODEL_SECONDS` a turn (generation is never free), Wordle
with short replies and with ~2 KB replies (a long conversation, ~15 KB kept per rollout). A
rollout's latency is the worker's time for it, from taking the request to its response sent and
its trajectory handed to the store. Memory: tracemalloc's peak of the worker's allocations,
in separate runs (tracing slows everything alike). Runs alternate off/on, `ROUNDS` each; the
ratio on/off of each percentile is printed. Nothing is asserted: it is a measurement.

Run: `python -m bench.trajectories` (`BENCH_QUICK=1` shortens it).
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import boto3

from bench.moto_server import moto_server
from domain.bucket import trajectories_prefix
from domain.protocol import RolloutRequest, dump
from domain.trajectories import Trajectory
from reward_envs.wordle import load_environment, words
from reward_envs.worker.model_client import CallableModel
from reward_envs.worker.queues import SqsRolloutQueues
from reward_envs.worker.settings import WorkerSettings
from reward_envs.worker.trajectory_store import TrajectoryStore, s3_put
from reward_envs.worker.worker import RewardWorker

QUICK = os.environ.get("BENCH_QUICK") == "1"
ROLLOUTS = 32 if QUICK else 320
ROUNDS = 1 if QUICK else 2
MODEL_SECONDS = 0.005
CONCURRENCY = 16
ENV = load_environment()


def _model(reply_characters: int) -> CallableModel:
    rng = random.Random(1)
    padding = "I think about letters and positions. " * (reply_characters // 38)

    def reply(_messages: Any) -> str:
        return f"{padding}[{rng.choice(words.allowed())}]"

    return CallableModel(reply, delay=MODEL_SECONDS)


def _client(service: str, url: str) -> Any:
    return boto3.client(
        service,
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
    )


# The store off; on, uploading to moto's S3 (the same process as SQS here: on AWS they are apart);
# on with its uploads discarded (what the store costs the worker's own process).
ARMS = ("off", "on", "on, uploads discarded")


def one_run(
    url: str, number: int, *, store: str, reply_characters: int, trace: bool
) -> tuple[list[float], int, int]:
    """Latencies (s), peak traced bytes (0 untraced), trajectories written."""
    sqs, s3 = _client("sqs", url), _client("s3", url)
    queues = [
        sqs.create_queue(QueueName=f"b{number}-{n}.fifo", Attributes={"FifoQueue": "true"})[
            "QueueUrl"
        ]
        for n in ("q", "r")
    ]
    bucket = f"bench-{number}"
    s3.create_bucket(Bucket=bucket)
    for start in range(0, ROLLOUTS, 10):
        sqs.send_message_batch(
            QueueUrl=queues[0],
            Entries=[
                {
                    "Id": str(i),
                    "MessageBody": dump(
                        RolloutRequest(sample_id=f"r{i}_0", data={"answer": words.answers()[i]})
                    ),
                    "MessageGroupId": f"g{i}",
                    "MessageDeduplicationId": str(i),
                }
                for i in range(start, min(start + 10, ROLLOUTS))
            ],
        )
    settings = WorkerSettings(
        rollout_request_queue_url=queues[0],
        rollout_response_queue_url=queues[1],
        wait_seconds=0,
        concurrency=CONCURRENCY,
        run_id="bench",
    )
    put = s3_put(s3, bucket) if store == "on" else lambda key, body: None
    trajectories = (
        TrajectoryStore(put, prefix=trajectories_prefix("bench")) if store != "off" else None
    )
    worker = RewardWorker(
        queues=SqsRolloutQueues(
            sqs, requests_url=queues[0], responses_url=queues[1], dead_letter_url=None
        ),
        environment=ENV,
        model=_model(reply_characters),
        settings=settings,
        trajectories=trajectories,
    )
    latencies: list[float] = []
    work: Callable[..., bool] = worker._work

    def timed(task: Any, request: Any) -> bool:
        began = time.perf_counter()
        done = work(task, request)
        latencies.append(time.perf_counter() - began)
        return done

    worker._work = timed  # type: ignore[method-assign]
    if trace:
        tracemalloc.start()
    stats = worker.run(exit_when_idle=True)
    peak = tracemalloc.get_traced_memory()[1] if trace else 0
    if trace:
        tracemalloc.stop()
    worker.close()
    if stats.completed != ROLLOUTS:
        raise RuntimeError(f"completed {stats.completed} of {ROLLOUTS}")
    written = trajectories.stats.written if trajectories else 0
    return latencies, peak, written


def handing_over_us(reply_characters: int, count: int = 2000) -> float:
    """The rollout thread's own share of the store: building a trajectory of a six-turn
    Wordle conversation (its JSON included) and `add` — microseconds each, nothing uploaded."""
    model = _model(reply_characters)
    conversation: list[dict[str, Any]] = [{"role": "user", "content": "Guess the word."}]
    for _ in range(6):
        conversation += [model.chat(conversation, sample_id="s", step_id="s", timeout=1).message]
        conversation.append({"role": "user", "content": "c r a n e: 🟩⬛⬛⬛⬛"})
    store = TrajectoryStore(lambda key, body: None, prefix="p/", flush_rows=10**9)
    started = time.perf_counter()
    for number in range(count):
        store.add(
            Trajectory(
                run_id="bench", sample_id=f"s{number}_0", record_id=f"s{number}",
                finished_at=datetime.now(UTC), stop_reason="max_turns", reward=0.2,
                turn_rewards=[0.0] * 6, finish_reasons=["stop"] * 6, policy_version=3,
                messages=conversation, metrics={"turns": 6.0}, error=None,
                environment="wordle", environment_version="1", config_hash="c", writer="w",
            )
        )  # fmt: skip
    return (time.perf_counter() - started) / count * 1e6


def percentile(values: list[float], share: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[round(share * 100) - 1]


def main() -> int:
    print(
        f"trajectory store bench — {os.cpu_count()} cores, {ROLLOUTS} Wordle rollouts a run, "
        f"{CONCURRENCY} at once, model {MODEL_SECONDS * 1000:.0f} ms a turn, {ROUNDS} rounds"
    )
    server, url = moto_server()
    number = 0
    try:
        for label, characters in (("short replies", 0), ("2 KB replies", 2000)):
            latency: dict[str, list[float]] = {arm: [] for arm in ARMS}
            peaks: dict[str, list[int]] = {arm: [] for arm in ARMS}
            for _ in range(ROUNDS):
                for store in ARMS:
                    number += 1
                    times, _, written = one_run(
                        url, number, store=store, reply_characters=characters, trace=False
                    )
                    if store != "off" and written != ROLLOUTS:
                        raise RuntimeError(f"store wrote {written} of {ROLLOUTS}")
                    latency[store] += times
                    number += 1
                    peaks[store].append(
                        one_run(url, number, store=store, reply_characters=characters, trace=True)[
                            1
                        ]
                    )
            print(f"\n{label}:")
            print(f"  handing a rollout to the store: {handing_over_us(characters):.0f} µs")
            for name, share in (("p50", 0.50), ("p99", 0.99)):
                off = percentile(latency["off"], share)
                arms = "   ".join(
                    f"{arm} {percentile(latency[arm], share) * 1000:.1f} ms "
                    f"({percentile(latency[arm], share) / off:.3f})"
                    for arm in ARMS[1:]
                )
                print(f"  rollout latency {name}: off {off * 1000:.1f} ms   {arms}")
            off_peak, on_peak = max(peaks["off"]), max(peaks["on"])
            print(
                f"  peak traced memory:    off {off_peak / 2**20:7.1f} MiB  on "
                f"{on_peak / 2**20:7.1f} MiB  (+{(on_peak - off_peak) / 2**20:.1f} MiB)"
            )
    finally:
        server.terminate()
        server.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
