"""Router throughput and added latency per model turn (DESIGN.md section 9: <= 50 ms p99).

The whole path of one turn: SigV4-signed POST -> proxy (Function URL adapter on loopback) ->
conversation table + generate-requests queue -> an instant scripted trainer -> generate-
responses queue -> consumer (event source adapter, long polling) -> table -> proxy -> client.
SQS and DynamoDB are moto's server in another process, so absolute numbers are moto's, not
AWS's; the model answers instantly, so all the time measured is the router's.
Run: `python -m bench.router` (BENCH_QUICK=1 for a short run). Nothing is asserted.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import boto3
from botocore.credentials import Credentials

from bench.moto_server import moto_server
from domain.run_queues import create_run_queues
from lambdas.router.consumer import Consumer
from lambdas.router.conversations import ConversationStore, create_table
from lambdas.router.proxy import Proxy
from local_trainer.scripted import ScriptedTrainer
from mtrl.local.function_url import FunctionUrlServer
from mtrl.local.sqs_event_source import SqsEventSource
from reward_envs.worker.router_client import RouterClient

QUICK = os.environ.get("BENCH_QUICK") == "1"
RUN, TOKEN, MODEL = "bench-run", "bench-token", "nova-lite-2"


def main() -> int:
    server, url = moto_server()
    try:
        clients = {
            "region_name": "us-east-1",
            "aws_access_key_id": "bench",
            "aws_secret_access_key": "bench",
            "endpoint_url": url,
        }
        sqs, db = boto3.client("sqs", **clients), boto3.client("dynamodb", **clients)
        create_table(db, "conversations")
        store = ConversationStore(db, "conversations")
        queues = create_run_queues(sqs, prefix="bench", run_id=RUN)
        store.put_run(RUN, token=TOKEN, queues=queues.urls(), model=MODEL, now=time.time())
        proxy = Proxy(store, sqs, wait_seconds=5)
        consumer = Consumer(store)
        trainer = ScriptedTrainer(
            sqs,
            requests_url=queues.generate_requests,
            responses_url=queues.generate_responses,
            reply=lambda request: "[crane]",
            wait_seconds=1,
        )
        trainer.start()
        with (
            FunctionUrlServer(lambda event, _c: proxy.handle(event)) as function_url,
            SqsEventSource(
                sqs,
                queues.generate_responses,
                lambda event, _c: consumer.handle(event),
                wait_seconds=1,
            ),
        ):
            client = RouterClient(
                function_url.url,
                run_id=RUN,
                run_token=TOKEN,
                region="us-east-1",
                credentials=lambda: Credentials("AKIDBENCH", "bench"),
            )

            def conversation(index: int) -> list[float]:
                messages = [{"role": "user", "content": "Guess 1 of 6:"}]
                took = []
                for turn in range(3):
                    started = time.perf_counter()
                    reply = client.chat(
                        messages,
                        sample_id=f"s{index}_0",
                        step_id=f"s{index}_0_{turn + 1}",
                        timeout=30,
                    )
                    took.append(time.perf_counter() - started)
                    messages += [
                        reply.message,
                        {"role": "user", "content": f"Guess {turn + 2} of 6:"},
                    ]
                return took

            sequential = [t for i in range(10 if QUICK else 40) for t in conversation(i)]
            count = 16 if QUICK else 64
            started = time.perf_counter()
            with ThreadPoolExecutor(max_workers=8) as pool:
                parallel = [
                    t for took in pool.map(conversation, range(1000, 1000 + count)) for t in took
                ]
            elapsed = time.perf_counter() - started
        trainer.stop.set()
    finally:
        server.terminate()
        server.wait(timeout=10)

    def percentile(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    print(
        f"nova-mtrl router bench — {os.cpu_count()} cores, Python {sys.version.split()[0]}, SQS/DynamoDB: moto server"
    )
    print(
        f"added latency per turn, one at a time ({len(sequential)} turns): p50 {percentile(sequential, 0.5):.0f} ms, p99 {percentile(sequential, 0.99):.0f} ms (target <= 50 ms p99 on AWS)"
    )
    print(
        f"8 concurrent conversations ({len(parallel)} turns): {len(parallel) / elapsed:.1f} turns/s, p50 {percentile(parallel, 0.5):.0f} ms, p99 {percentile(parallel, 0.99):.0f} ms"
    )
    print(
        f"statistics: mean sequential {statistics.mean(sequential) * 1000:.0f} ms; consumer recorded {consumer.counters.completed}, duplicates {consumer.counters.duplicates}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
