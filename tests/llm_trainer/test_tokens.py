"""Token-exact trajectories: the trainer trains on the very tokens generation saw and sampled —
never on a re-tokenized conversation — and its loss covers only the sampled ones. Proven over
several turns through the real generation service, with a tokenizer whose encodings are
ambiguous (tiny.py's merges) and with a chat template that rewrites earlier turns."""

from __future__ import annotations

from typing import Any

import pytest

from domain.protocol import GenerateRequest, GenerateResponse, dump, parse, turn_of
from llm_trainer.service import GenerationService, render_prompt
from llm_trainer.tiny import THINK_STRIPPING_TEMPLATE, tiny_tokenizer
from llm_trainer.tokens import SampledTurn, Segment, merged_turns, segments, stale_samples
from tests.llm_trainer.fakes import QUEUES, ScriptedGenerator
from tests.llm_trainer.test_service import job_for


def turn(number: int, prompt: list[int], completion: list[int]) -> SampledTurn:
    logprobs = tuple(-0.1 * (i + 1) for i in range(len(completion)))
    return SampledTurn(number, tuple(prompt), tuple(completion), logprobs, "stop", 0)


def test_a_turn_whose_prompt_extends_the_sequence_continues_it_with_the_gap_masked() -> None:
    built = segments([turn(0, [1, 2, 3], [4, 5]), turn(1, [1, 2, 3, 4, 5, 6, 7], [8])])
    assert len(built) == 1
    assert built[0].token_ids == [1, 2, 3, 4, 5, 6, 7, 8]
    assert built[0].sampled == [False, False, False, True, True, False, False, True]
    assert built[0].behaviour_logprobs == pytest.approx([0, 0, 0, -0.1, -0.2, 0, 0, -0.1])


def test_a_turn_whose_prompt_rewrites_the_past_starts_its_own_sequence() -> None:
    # Given out of order: turns are ordered by their number.
    built = segments([turn(1, [1, 2, 9, 6], [7]), turn(0, [1, 2, 3], [4, 5])])
    assert [segment.token_ids for segment in built] == [[1, 2, 3, 4, 5], [1, 2, 9, 6, 7]]
    assert [segment.sampled for segment in built] == [
        [False, False, False, True, True],
        [False, False, False, False, True],
    ]


def test_a_turn_must_have_a_logprob_per_sampled_token() -> None:
    with pytest.raises(ValueError, match="2 sampled tokens but 1 log-probabilities"):
        SampledTurn(0, (1,), (2, 3), (-1.0,), "stop", 0)


def test_turn_numbers_come_from_step_ids() -> None:
    assert turn_of("game-1_7_12") == 12
    assert turn_of("no-number") == -1


def ids(tokenizer: Any, *tokens: str) -> list[int]:
    return [tokenizer.convert_tokens_to_ids(token) for token in tokens]


def play(
    tokenizer: Any, scripts: list[list[int]], follow_ups: list[str]
) -> tuple[list[GenerateResponse], list[Segment], ScriptedGenerator]:
    """A conversation of len(scripts) turns played through the generation service: the user's
    first message, then per turn the service's answer (as the worker appends it) and a
    follow-up. Returns the responses sent, the segments training would use, the generator."""
    generator = ScriptedGenerator(scripts, stop_token_id=tokenizer.eos_token_id)
    service = GenerationService(job_for(), sqs=Outbox(), tokenizer=tokenizer, generator=generator)
    service.record(["s_0"])
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Guess the word."}]
    responses = []
    for number in range(len(scripts)):
        request = GenerateRequest(sample_id="s_0", step_id=f"s_0_{number}", messages=messages)
        service.answer([{"Body": dump(request), "ReceiptHandle": str(number)}])
        response = service.sqs.sent.pop()
        responses.append(response)
        messages = [
            *messages,
            response.data.choices[0].message.model_dump(),
            {"role": "user", "content": follow_ups[number]},
        ]
    return responses, segments(service.recorded(["s_0"])["s_0"]), generator


class Outbox:
    """A fake SQS that keeps what the service sends (its generate responses)."""

    def __init__(self) -> None:
        self.sent: list[GenerateResponse] = []

    def send_message_batch(self, *, QueueUrl: str, Entries: list[dict]) -> dict:  # noqa: N803
        assert QueueUrl == QUEUES["generate_responses"]
        self.sent += [parse(GenerateResponse, entry["MessageBody"]) for entry in Entries]
        return {"Successful": [], "Failed": []}

    def delete_message_batch(self, **_: Any) -> dict:
        return {"Successful": [], "Failed": []}


def sampled_tokens(segment: Segment) -> list[int]:
    return [t for t, sampled in zip(segment.token_ids, segment.sampled, strict=True) if sampled]


def answered_tokens(response: GenerateResponse) -> list[int]:
    content = response.data.choices[0].logprobs["content"]
    return [int(token.token.removeprefix("token_id:")) for token in content]


def test_several_turns_train_on_the_sampled_tokens_not_a_re_tokenization(tokenizer: Any) -> None:
    end = tokenizer.eos_token_id
    # Turn 0 samples "a" then "b": the reply reads "ab", which the tokenizer encodes as the one
    # token "ab" — a re-tokenized conversation would train on a token never sampled.
    scripts = [ids(tokenizer, "[", "c", "r", "a", "b", "e", "]") + [end],
               ids(tokenizer, "[", "s", "l", "a", "t", "e", "]") + [end],
               ids(tokenizer, "o", "k") + [end]]  # fmt: skip
    responses, built, generator = play(tokenizer, scripts, ["Again.", "Once more.", "Done."])
    reply = responses[0].data.choices[0].message.content
    assert reply == "[crabe]"
    assert tokenizer.encode(reply, add_special_tokens=False) != scripts[0][:-1]  # ambiguous
    # Every token the loss covers is one generation sampled, in order, turn after turn...
    assert [t for segment in built for t in sampled_tokens(segment)] == [
        t for script in scripts for t in script
    ]
    assert [answered_tokens(response) for response in responses] == scripts
    # ...and every sequence is a prompt exactly as the model read it, then what it sampled.
    prompts = generator.prompts
    assert built[0].token_ids == prompts[0] + scripts[0]
    for segment in built:
        assert segment.sampled_count == sum(segment.sampled)
        start = next(
            i for i, prompt in enumerate(prompts) if segment.token_ids[: len(prompt)] == prompt
        )
        assert not any(segment.sampled[: len(prompts[start])])  # the prompt is masked
    # The reply that re-encodes differently cannot continue turn 0's sequence; the canonical
    # one (turn 1, "[slate]") lets turn 2 continue turn 1's.
    assert len(built) == 2
    assert prompts[2][: len(prompts[1]) + len(scripts[1])] == prompts[1] + scripts[1]
    assert built[1].token_ids == prompts[2] + scripts[2]


def test_a_template_that_drops_earlier_reasoning_gets_a_sequence_per_turn() -> None:
    stripping = tiny_tokenizer(chat_template=THINK_STRIPPING_TEMPLATE)
    end = stripping.eos_token_id
    thought = ids(stripping, "<think>", "h", "m", "</think>", "y", "e", "s")
    scripts = [thought + [end], ids(stripping, "n", "o") + [end]]
    responses, built, generator = play(stripping, scripts, ["Sure?", "Bye."])
    assert responses[0].data.choices[0].message.content == "<think>hm</think>yes"
    # Turn 1's prompt shows turn 0's reply without its reasoning...
    assert stripping.convert_tokens_to_ids("<think>") not in generator.prompts[1]
    # ...so each turn trains as it was generated: its own prompt, its own sampled tokens.
    assert [segment.token_ids for segment in built] == [
        generator.prompts[0] + scripts[0],
        generator.prompts[1] + scripts[1],
    ]
    assert [sampled_tokens(segment) for segment in built] == scripts


def test_the_service_renders_the_conversation_with_the_chat_template(tokenizer: Any) -> None:
    request = GenerateRequest(
        sample_id="s", step_id="s_0", messages=[{"role": "user", "content": "hi"}]
    )
    text = tokenizer.decode(render_prompt(tokenizer, request))
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_a_rollout_with_a_turn_from_weights_too_old_is_stale() -> None:
    def turn(number: int, version: int) -> SampledTurn:
        return SampledTurn(number, (1,), (2,), (-0.5,), "stop", version)

    turns = {
        "fresh": [turn(0, 4), turn(1, 5)],
        "one behind": [turn(0, 3), turn(1, 4)],
        "two behind": [turn(0, 2), turn(1, 5)],  # its first turn: before the last two updates
    }
    # The weights at version 5 are about to be updated: a bound of N keeps turns of 5-N on.
    assert stale_samples(turns, version=5, bound=0) == {"fresh", "one behind", "two behind"}
    assert stale_samples(turns, version=5, bound=1) == {"one behind", "two behind"}
    assert stale_samples(turns, version=5, bound=2) == {"two behind"}
    assert stale_samples(turns, version=5, bound=3) == set()
    assert stale_samples(turns, version=4, bound=0) == {"one behind", "two behind"}


def test_turns_sampled_by_several_processes_are_put_back_in_order() -> None:
    def turn(number: int) -> SampledTurn:
        return SampledTurn(number, (1,), (2 + number,), (-0.5,), "stop", 0)

    first = {"a": [turn(0), turn(2)], "b": [turn(1)]}
    second = {"a": [turn(1)], "c": [turn(0)]}
    merged = merged_turns([first, second, {}])
    assert {sample: [t.turn for t in turns] for sample, turns in merged.items()} == {
        "a": [0, 1, 2], "b": [1], "c": [0],
    }  # fmt: skip
    assert merged_turns([{}]) == {}
