"""The reward side held against AWS's published BYOO contract.

Sources:
- the v0 messages: Amazon Nova user guide, "Reinforcement Learning" (Nova Forge), section "BYOO
  request and response formats" (docs.aws.amazon.com/nova/latest/nova2-userguide/nova-hp-rft-forge);
- the HTTP side: Nova's starter-kit client, aws-samples/sample-nova-multi-turn-rl-infra,
  client/nova_async_client.py (commit b7a700c). It is given a base URL and SigV4 settings
  (service `lambda`), strips a trailing `/v1` from the base, sends only `Content-Type` of its own,
  puts `sample_id`/`request_id` in the JSON body, treats a 202 or a status of pending/processing
  as "poll again", validates the finished answer with OpenAI's `ChatCompletion`, and reports
  `{"id", "aggregate_reward_score", "metrics_list": [{"name", "value", "type": "Reward"|"Metric"}]}`.
  `StarterKitWire` below is our own client doing exactly that on the wire.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Generator
from typing import Any

import httpx
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from hypothesis import given
from hypothesis import strategies as st
from openai.types.chat.chat_completion import ChatCompletion

from domain.protocol import (
    GenerateRequest,
    GenerateResponse,
    RolloutRequest,
    RolloutResponse,
    chat_completion,
    dump,
    parse,
    run_base_url,
    split_run_path,
)
from tests.router.conftest import GUESSES, MODEL, OTHER_TOKEN, RUN, TOKEN, Router, answer, event

# The four documented examples, as the user guide prints them (the rollout request's timestamp
# is elided there as "2025-10-28T..."; a full ISO 8601 time stands in for it).
DOCUMENTED_ROLLOUT_REQUEST = {
    "version": "v0",
    "timestamp": "2025-10-28T12:00:00Z",
    "sample_id": "sample-000_0",
    "max_length": 10240,
    "rewards": {"range": [0.0, 1.0]},
    "data": {
        "problem": "How many six-digit numbers are there in which all digits are odd? "
        "Let's think step by step and output the final answer within \\boxed{}.",
        "answer": "15625",
    },
}
DOCUMENTED_GENERATE_REQUEST = {
    "version": "v0",
    "sample_id": "sample-000_0",
    "step_id": "sample-000_0_0",
    "messages": [{"role": "user", "content": "How many six-digit numbers are there ...?"}],
}
DOCUMENTED_GENERATE_RESPONSE = {
    "version": "v0",
    "sample_id": "sample-000_0",
    "step_id": "sample-000_0_0",
    "data": {
        "choices": [
            {
                "message": {"content": "To determine how many six-digit numbers..."},
                "finish_reason": "stop",
                "logprobs": {"content": [{"token": "token_id:123", "logprob": -0.5}]},
            }
        ],
        "serving_model_num": 0,
    },
    "finish_reason": "stop",
}
DOCUMENTED_ROLLOUT_RESPONSE = {
    "version": "v0",
    "sample_id": "sample-000_0",
    "stop_reason": "end_of_conversation",
    "rewards": {"aggregate_score": 0.85},
}


@pytest.mark.parametrize(
    ("kind", "documented"),
    [
        (RolloutRequest, DOCUMENTED_ROLLOUT_REQUEST),
        (GenerateRequest, DOCUMENTED_GENERATE_REQUEST),
        (GenerateResponse, DOCUMENTED_GENERATE_RESPONSE),
        (RolloutResponse, DOCUMENTED_ROLLOUT_RESPONSE),
    ],
)
def test_the_documented_v0_examples_parse_and_round_trip(kind: type, documented: dict) -> None:
    message = parse(kind, json.dumps(documented))
    assert parse(kind, dump(message)) == message
    # Nothing documented is dropped on the way through (a message's fields, as sent on).
    sent_on = json.loads(dump(message))
    for key, value in documented.items():
        if key != "data" or kind is not GenerateResponse:
            assert sent_on[key] == (list(value) if isinstance(value, tuple) else value), key
    if kind is GenerateResponse:
        assert sent_on["data"]["serving_model_num"] == 0
        assert sent_on["data"]["choices"][0]["logprobs"] == {
            "content": [{"token": "token_id:123", "logprob": -0.5}]
        }


def test_the_documented_generate_response_is_served_as_a_chat_completion_openai_accepts() -> None:
    response = parse(GenerateResponse, json.dumps(DOCUMENTED_GENERATE_RESPONSE))
    served = chat_completion("sample-000_0_0", response.completion(), created=1.9e9, model=MODEL)
    completion = ChatCompletion.model_validate(served)
    choice = completion.choices[0]
    assert (completion.id, completion.model, completion.created) == (
        "sample-000_0_0",
        MODEL,
        1_900_000_000,
    )
    assert (choice.index, choice.finish_reason, choice.message.role) == (0, "stop", "assistant")
    assert choice.message.content == "To determine how many six-digit numbers..."
    (token,) = choice.logprobs.content
    assert (token.token, token.logprob, token.top_logprobs) == ("token_id:123", -0.5, [])
    assert served["serving_model_num"] == 0


def test_a_choice_without_its_own_finish_reason_takes_the_responses_else_stop() -> None:
    documented = json.loads(json.dumps(DOCUMENTED_GENERATE_RESPONSE))
    del documented["data"]["choices"][0]["finish_reason"]
    documented["finish_reason"] = "length"
    response = parse(GenerateResponse, json.dumps(documented))
    assert response.completion()["choices"][0]["finish_reason"] == "length"
    del documented["finish_reason"]
    bare = parse(GenerateResponse, json.dumps(documented)).completion()
    assert "finish_reason" not in bare["choices"][0]
    served = chat_completion("s_1", bare, created=0, model=MODEL)
    assert ChatCompletion.model_validate(served).choices[0].finish_reason == "stop"


_SEGMENT = st.text(min_size=1, max_size=64).filter(lambda text: text not in {".", ".."})


@given(
    run_id=_SEGMENT,
    token=_SEGMENT,
    route=st.sampled_from(["/v1/chat/completions", "/v1/chat/completions/a_1", "/v1/x"]),
)
def test_a_run_base_url_carries_any_run_id_and_token_back_to_the_proxy(
    run_id: str, token: str, route: str
) -> None:
    base = run_base_url("https://abc.lambda-url.us-east-1.on.aws/", run_id, token)
    path = httpx.URL(base + route).raw_path.decode()
    assert split_run_path(path) == (run_id, token, route)


def test_paths_outside_a_run_are_not_taken_for_one() -> None:
    for path in ("/v1/chat/completions", "/runs/only-a-run", "/runs//t/v1", "/x/runs/r/t/v1"):
        assert split_run_path(path) is None, path
    assert split_run_path("/runs/r/t") == ("r", "t", "/")


def test_reports_take_the_starter_kits_metric_types_and_nothing_else(router: Router) -> None:
    def report(metric_type: str) -> tuple[int, dict]:
        body = {
            "id": f"s-{metric_type}",
            "aggregate_reward_score": 0.5,
            "metrics_list": [{"name": "accuracy", "value": 0.5, "type": metric_type}],
        }
        return answer(router.proxy.handle(event("POST", "/v1/rollouts/report", body)))

    assert report("Reward")[0] == report("Metric")[0] == 200
    status, body = report("gauge")
    assert status == 400
    assert body["error"]["message"] == "metrics_list.0.type: Input should be 'Reward' or 'Metric'"
    sent = [
        parse(RolloutResponse, message["Body"])
        for message in router.messages(router.queues.rollout_responses)
    ]
    assert sorted((r.sample_id, r.metrics[0].type) for r in sent) == [
        ("s-Metric", "Metric"),
        ("s-Reward", "Reward"),
    ]


# --- the starter kit's flow, on the wire ----------------------------------------------------


class SigV4(httpx.Auth):
    def __init__(self, credentials: Credentials, *, service: str, region: str) -> None:
        self.credentials, self.service, self.region = credentials, service, region
        self.signed: list[tuple[str, str]] = []  # (method, path) of every request signed

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        headers = {k: v for k, v in request.headers.items() if k.lower() != "connection"}
        signing = AWSRequest(
            method=request.method, url=str(request.url), data=request.content, headers=headers
        )
        SigV4Auth(self.credentials, self.service, self.region).add_auth(signing)
        request.headers.update(dict(signing.headers))
        self.signed.append((request.method, request.url.raw_path.decode()))
        yield request


class StarterKitWire:
    """Create, then poll, then report, as the starter-kit client does (module docstring)."""

    def __init__(self, base_url: str, auth: SigV4, *, poll_seconds: float, max_polls: int) -> None:
        base = base_url.rstrip("/")
        self.base = base.removesuffix("/v1")
        self.http = httpx.AsyncClient(auth=auth, timeout=10)
        self.poll_seconds, self.max_polls = poll_seconds, max_polls

    async def chat(self, **body: Any) -> ChatCompletion:
        created = _ok(await self._send("POST", "/v1/chat/completions", body))
        if created.get("object") == "chat.completion":
            return ChatCompletion.model_validate(created)
        path = f"/v1/chat/completions/{created['step_id']}"
        for _ in range(self.max_polls):
            polled = await self._send("GET", path)
            data = {"status": "pending"} if polled.status_code == 202 else _ok(polled)
            if data.get("status") == "completed":
                return ChatCompletion.model_validate(data["result"])
            if data.get("status") == "failed":
                raise RuntimeError(data.get("error") or "Task failed")
            if data.get("status") not in {"pending", "processing", None}:
                raise RuntimeError(f"Unexpected status while polling task: {data}")
            await asyncio.sleep(self.poll_seconds)
        raise TimeoutError(f"{path}: no completion after {self.max_polls} polls")

    async def report(self, payload: dict[str, Any]) -> dict[str, Any]:
        return _ok(await self._send("POST", "/v1/rollouts/report", payload))

    async def _send(self, method: str, path: str, body: Any = None) -> httpx.Response:
        return await self.http.request(
            method,
            self.base + path,
            json=body,
            headers={"Content-Type": "application/json"},
        )


def _ok(response: httpx.Response) -> dict[str, Any]:
    if response.is_error:
        raise RuntimeError(
            f"Request failed with status {response.status_code}: "
            f"{response.json().get('error', {}).get('message', response.text)}"
        )
    return response.json()


def test_a_starter_kit_client_given_only_the_runs_base_url_plays_and_reports(
    router: Router,
) -> None:
    queues = router.queues
    auth = SigV4(Credentials("AKIDTEST", "secret"), service="lambda", region="us-east-1")
    samples = [f"wordle_{n:03d}_0" for n in range(8)]

    async def play(client: StarterKitWire, sample_id: str) -> list[str]:
        messages: list[dict[str, str]] = [{"role": "user", "content": "Guess the word."}]
        for _ in GUESSES:
            completion = await client.chat(
                model="nova", messages=messages, sample_id=sample_id, request_id=f"r-{sample_id}"
            )
            assert (completion.model, completion.choices[0].finish_reason) == (MODEL, "stop")
            messages += [
                {"role": "assistant", "content": completion.choices[0].message.content},
                {"role": "user", "content": "X X X X X"},
            ]
        recorded = await client.report(
            {
                "id": sample_id,
                "aggregate_reward_score": 0.8,
                "metrics_list": [
                    {"name": "win", "value": 1.0, "type": "Reward"},
                    {"name": "turns", "value": 3, "type": "Metric"},
                ],
            }
        )
        assert recorded == {"id": sample_id, "recorded": True, "sent": True}
        return [m["content"] for m in messages if m["role"] == "assistant"]

    async def everything(router_url: str) -> tuple[list[list[str]], str]:
        # A user who copies the base URL with a `/v1` on it: the starter kit strips it.
        base_url = run_base_url(router_url, RUN, TOKEN) + "/v1/"
        client = StarterKitWire(base_url, auth, poll_seconds=0.02, max_polls=500)
        stranger = StarterKitWire(
            run_base_url(router_url, RUN, OTHER_TOKEN), auth, poll_seconds=0, max_polls=1
        )
        async with client.http, stranger.http:
            played = await asyncio.gather(*(play(client, sample) for sample in samples))
            with pytest.raises(RuntimeError) as refused:
                await stranger.chat(
                    model="nova", messages=[{"role": "user", "content": "hi"}], sample_id="x_0"
                )
        return played, str(refused.value)

    with router.serving(wait_seconds=0.05) as (url, trainer):
        played, refusal = asyncio.run(everything(url.url))

    assert played == [GUESSES] * len(samples)
    assert refusal == (
        "Request failed with status 403: not allowed for run 'run-1': "
        "check the run id and token in the base URL"
    )
    # Every call went under the run's base URL, the `/v1` the user gave stripped as the starter
    # kit does (the stranger's, last, under its own).
    *ours, (_, strangers) = auth.signed
    assert all(path.startswith(f"/runs/{RUN}/{TOKEN}/v1/") for _, path in ours)
    assert strangers == f"/runs/{RUN}/{OTHER_TOKEN}/v1/chat/completions"
    reports = [path for method, path in ours if path.endswith("/v1/rollouts/report")]
    assert len(reports) == len(samples)
    # What the trainer side receives: one generate request per turn, one v0 rollout response per
    # sample carrying the reported metric types.
    assert trainer.answered == len(GUESSES) * len(samples)
    responses = [
        parse(RolloutResponse, message["Body"])
        for message in router.messages(queues.rollout_responses)
    ]
    assert sorted(r.sample_id for r in responses) == samples
    assert all(
        r.aggregate_score == 0.8
        and [(m.name, m.value, m.type) for m in r.metrics]
        == [("win", 1.0, "Reward"), ("turns", 3.0, "Metric")]
        for r in responses
    )
    assert router.store.run_summary(RUN, now=router.clock() + 1e6, stuck_after_seconds=60) == {
        "in_flight": 0,
        "finished": len(samples),
        "failed": 0,
        "stuck": 0,
    }
