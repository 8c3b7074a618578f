"""Reward-environment throughput and the Wordle reward ceiling (DESIGN.md section 9).

Prints, with the machine's core count:
- Wordle environment steps per second in-process (random allowed guesses);
- reward-worker rollouts per second per core with an instant model: the rollout runner alone,
  and the whole worker loop over SQS FIFO (moto's server in another process, so the CPU
  counted is the worker's: boto3 signing and HTTP included, as against AWS);
- the solver oracle's win rate and mean guesses over the whole answer list (target: 100 %,
  <= 3.55).
Peer: TextArena's Wordle needs NLTK corpora and a tagger downloaded at run time, which this
offline machine cannot fetch, so no ratio against it is printed.
Run: `python -m bench.envs`. Nothing here is asserted: it is a measurement. `BENCH_QUICK=1`
shortens it.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time

import boto3

from bench.moto_server import moto_server
from domain.protocol import RolloutRequest, dump
from reward_envs.interface import Record
from reward_envs.wordle import load_environment, words
from reward_envs.wordle.solver import default_solver
from reward_envs.worker.model_client import CallableModel
from reward_envs.worker.queues import SqsRolloutQueues
from reward_envs.worker.rollout import play_rollout
from reward_envs.worker.settings import WorkerSettings
from reward_envs.worker.worker import RewardWorker

QUICK = os.environ.get("BENCH_QUICK") == "1"
ENV = load_environment()


def cpu_seconds() -> float:
    return time.process_time()


def wordle_steps_per_second(steps: int) -> float:
    rng = random.Random(0)
    guesses = words.allowed()
    done = 0
    started = time.perf_counter()
    while done < steps:
        episode, _ = ENV.reset(
            Record(id=str(done), metadata={"answer": rng.choice(words.answers())})
        )
        finished = False
        while not finished and done < steps:
            finished = episode.step(f"[{rng.choice(guesses)}]").done
            done += 1
    return done / (time.perf_counter() - started)


def _random_model() -> CallableModel:
    rng = random.Random(1)
    guesses = words.allowed()
    return CallableModel(lambda _messages: f"[{rng.choice(guesses)}]")


def runner_rollouts_per_cpu_second(count: int) -> float:
    model = _random_model()
    requests = [
        RolloutRequest(sample_id=f"r{i}_0", data={"answer": words.answers()[i % 2000]})
        for i in range(count)
    ]
    started = cpu_seconds()
    for request in requests:
        play_rollout(ENV, model, request)
    return count / (cpu_seconds() - started)


def worker_rollouts_per_cpu_second(count: int) -> float:
    server, url = moto_server()
    try:
        sqs = boto3.client(
            "sqs",
            endpoint_url=url,
            region_name="us-east-1",
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
        )
        urls = [
            sqs.create_queue(QueueName=f"b-{n}.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
            for n in ("q", "r")
        ]
        entries = [
            {
                "Id": str(i),
                "MessageBody": dump(
                    RolloutRequest(sample_id=f"r{i}_0", data={"answer": words.answers()[i % 2000]})
                ),
                "MessageGroupId": f"g{i}",
                "MessageDeduplicationId": str(i),
            }
            for i in range(count)
        ]
        for start in range(0, count, 10):
            sqs.send_message_batch(QueueUrl=urls[0], Entries=entries[start : start + 10])
        settings = WorkerSettings(
            rollout_request_queue_url=urls[0],
            rollout_response_queue_url=urls[1],
            wait_seconds=0,
        )
        queues = SqsRolloutQueues(
            sqs, requests_url=urls[0], responses_url=urls[1], dead_letter_url=None
        )
        worker = RewardWorker(
            queues=queues, environment=ENV, model=_random_model(), settings=settings
        )
        started = cpu_seconds()
        stats = worker.run(exit_when_idle=True)
        spent = cpu_seconds() - started
        worker.close()
    finally:
        server.terminate()
        server.wait(timeout=10)
    if stats.completed != count:
        raise RuntimeError(f"worker completed {stats.completed} of {count}")
    return count / spent


def solver_ceiling(limit: int | None) -> tuple[float, float, int, float]:
    solver = default_solver()
    answers = words.answers()[:limit] if limit else words.answers()
    started = time.perf_counter()
    results = [solver.play(secret) for secret in answers]
    seconds = time.perf_counter() - started
    wins = [r for r in results if r.won]
    return (
        len(wins) / len(results),
        statistics.mean(len(r.guesses) for r in wins),
        len(results),
        seconds,
    )


def main() -> int:
    cores = os.cpu_count()
    print(f"nova-mtrl environments bench — {cores} cores, Python {sys.version.split()[0]}")
    steps = wordle_steps_per_second(2_000 if QUICK else 200_000)
    runner = runner_rollouts_per_cpu_second(50 if QUICK else 5_000)
    worker = worker_rollouts_per_cpu_second(20 if QUICK else 1_000)
    win_rate, mean_guesses, games, seconds = solver_ceiling(20 if QUICK else None)
    rows = [
        ("Wordle env steps/s (1 thread)", f"{steps:,.0f}", ""),
        ("rollouts per CPU-second, runner only", f"{runner:,.0f}", ">= 200 per core"),
        (
            "rollouts per CPU-second, worker over SQS (moto server)",
            f"{worker:,.0f}",
            ">= 200 per core",
        ),
        (f"solver over {games} answers: win rate", f"{win_rate:.1%}", "100 %"),
        ("solver: mean guesses (wins)", f"{mean_guesses:.3f}", "<= 3.55"),
        ("solver: seconds for all games", f"{seconds:.1f}", ""),
    ]
    width = max(len(row[0]) for row in rows)
    for name, value, target in rows:
        print(f"{name:<{width}}  {value:>10}  {target}")
    print("peer: TextArena Wordle not measured (needs NLTK downloads, no network here)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
