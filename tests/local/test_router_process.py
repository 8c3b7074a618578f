"""The router process: DynamoDB, the proxy's Function URL and the consumer's pollers beside the
main process's embedded AWS, driven over its stdin and stdout (mtrl/local/router_process.py)."""

from __future__ import annotations

import time

import pytest
from botocore.credentials import Credentials

from domain.protocol import GenerateRequest
from domain.run_queues import create_run_queues
from lambdas.router.conversations import ConversationStore, create_table
from local_trainer.scripted import ScriptedTrainer
from mtrl.local.aws import LocalAws
from mtrl.local.physical import REGION
from mtrl.local.router_process import RouterProcess, Stop
from reward_envs.worker.model_client import ModelError
from reward_envs.worker.router_client import RouterClient

TABLE, RUN, TOKEN, MODEL = "conversations", "run-1", "token-1", "nova-lite-2"


def _until(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


def _reply(request: GenerateRequest) -> str:
    return f"[turn {sum(1 for m in request.messages if m.role == 'assistant')}]"


def test_a_chat_through_the_router_process_is_answered_and_its_state_lives_there() -> None:
    with RouterProcess() as router, LocalAws() as aws:
        aws.serve_elsewhere("dynamodb", router.ready().dynamodb)
        db, sqs, lambda_client = aws.client("dynamodb"), aws.client("sqs"), aws.client("lambda")
        create_table(db, TABLE)
        queues = create_run_queues(sqs, prefix="test", run_id=RUN)
        store = ConversationStore(db, TABLE)
        store.put_run(RUN, token=TOKEN, queues=queues.urls(), model=MODEL, now=time.time())
        client = RouterClient(
            router.ready().router, run_id=RUN, run_token=TOKEN, region=REGION,
            credentials=lambda: Credentials("local", "local"),
        )  # fmt: skip
        chat = [{"role": "user", "content": "Guess the word."}]

        # Before the pipeline is deployed (routed) the proxy is not there: 503, not a hang.
        with pytest.raises(ModelError, match="HTTP 503 from the router: .*not deployed yet"):
            client.chat(chat, sample_id="wordle_000_0", step_id="s", timeout=5)

        router.route(table=TABLE, sqs_endpoint=aws.endpoint)
        role = aws.client("iam").create_role(RoleName="r", AssumeRolePolicyDocument="{}")
        lambda_client.create_function(
            FunctionName="consumer", Runtime="python3.12", Role=role["Role"]["Arn"],
            Handler="lambdas.router.consumer.handler", Code={"ZipFile": b"x"},
        )  # fmt: skip
        aws.mappings.elsewhere["consumer"] = router
        responses_arn = sqs.get_queue_attributes(
            QueueUrl=queues.generate_responses, AttributeNames=["QueueArn"]
        )["Attributes"]["QueueArn"]
        mapping = lambda_client.create_event_source_mapping(
            EventSourceArn=responses_arn, FunctionName="consumer", BatchSize=10
        )["UUID"]
        trainer = ScriptedTrainer(
            sqs, requests_url=queues.generate_requests,
            responses_url=queues.generate_responses, reply=_reply,
        )  # fmt: skip
        trainer.start()
        try:
            turns = []
            for _ in range(2):
                turn = client.chat(chat, sample_id="wordle_000_0", step_id="s", timeout=20)
                turns.append(turn.message["content"])
                chat += [turn.message, {"role": "user", "content": "X"}]
        finally:
            trainer.stop.set()
            trainer.join(timeout=10)

        # The answers came from the trainer through SQS (main process) and the consumer
        # (router process), which wrote them to the router process's DynamoDB.
        assert turns == ["[turn 0]", "[turn 1]"] and trainer.answered == 2
        assert store.run_summary(RUN, now=time.time(), stuck_after_seconds=60)["in_flight"] == 1
        assert aws.server.client("dynamodb").list_tables()["TableNames"] == []
        assert db.list_tables()["TableNames"] == [TABLE]

        # The mapping's poller runs there until the mapping is deleted.
        assert aws.mappings.active == 1
        lambda_client.delete_event_source_mapping(UUID=mapping)
        assert _until(lambda: aws.mappings.active == 0)


def test_a_command_it_cannot_carry_out_is_an_error_that_says_why() -> None:
    with RouterProcess() as router, pytest.raises(RuntimeError, match="no poller 7"):
        router.ask(Stop(poller=7))


def test_it_ends_by_itself_when_its_channel_closes() -> None:
    with RouterProcess() as router:
        router.ready()
        process = router._process
    assert process.returncode == 0  # it exited on its own: not killed
