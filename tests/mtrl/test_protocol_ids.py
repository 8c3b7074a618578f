"""Ids the protocol puts on SQS: step ids within 128 characters and unique per sample and turn;
FIFO group and deduplication ids that SQS accepts (1-128 alphanumerics and punctuation,
botocore's SendMessage documentation), unique for unique inputs."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from domain.protocol import ID_LENGTH, RolloutRequest, fifo_id, sample_id_for, step_id_for

SQS_ID = re.compile(r"[!-~]{1,128}")
samples = st.text(min_size=1, max_size=ID_LENGTH)


@given(samples, samples)
def test_fifo_ids_are_what_sqs_takes_and_stay_distinct(a: str, b: str) -> None:
    assert SQS_ID.fullmatch(fifo_id(a)) and SQS_ID.fullmatch(fifo_id(b))
    assert (fifo_id(a) == fifo_id(b)) == (a == b)


def test_an_id_sqs_takes_is_kept_as_it_is() -> None:
    assert fifo_id("rec-7_3_2") == "rec-7_3_2"
    assert fifo_id("a b") != "a b" and fifo_id("x" * 129) != "x" * 129


@given(samples, samples, st.integers(1, 1000), st.integers(1, 1000))
def test_step_ids_fit_and_never_collide(a: str, b: str, turn_a: int, turn_b: int) -> None:
    first, second = step_id_for(a, turn_a), step_id_for(b, turn_b)
    assert len(first) <= ID_LENGTH and first.endswith(f"_{turn_a}")
    assert (first == second) == ((a, turn_a) == (b, turn_b))


def test_a_short_step_id_reads_as_sample_and_turn() -> None:
    assert step_id_for("w3_0", 2) == "w3_0_2"


@given(st.text(min_size=1, max_size=256), st.integers(0, 10**9))
def test_sample_ids_fit_and_name_their_record(record_id: str, number: int) -> None:
    sample = sample_id_for(record_id, number)
    assert len(sample) <= ID_LENGTH and sample.endswith(f"_{number}")
    request = RolloutRequest(sample_id=sample, data={"prompt": "p"})
    # The record id comes back whole when it fit, else as its first characters.
    assert record_id.startswith(request.record_id)
    if len(record_id) + len(f"_{number}") <= ID_LENGTH:
        assert request.record_id == record_id
