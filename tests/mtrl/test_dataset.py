"""The dataset schema and `mtrl validate`: line-numbered problems, streaming, exit codes."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from domain.dataset import MAX_LINE_BYTES, DatasetRecord, DatasetValidator, counted, read_records
from mtrl.cli import app

GOOD = {
    "id": "w-1",
    "metadata": {
        "prompt": "Play Wordle.",
        "answer": "crane",
        "task": "wordle",
        "info": {"level": 1},
    },
}


PROMPT_REQUIRED = (
    "Field required: text or chat messages (or a metadata.problem, the form Nova's BYOO data "
    "preparation shows)"
)


def _problems(data: bytes, **limits) -> tuple[list[str], DatasetValidator]:
    validator = DatasetValidator(**limits)
    return [str(p) for p in validator.problems(io.BytesIO(data))], validator


def _line(record: object) -> bytes:
    return json.dumps(record).encode() + b"\n"


def test_a_valid_dataset_with_bom_crlf_and_blank_lines() -> None:
    chat = {
        "id": "w-2",
        "metadata": {
            "prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
        },
    }
    data = b"\xef\xbb\xbf" + _line(GOOD).replace(b"\n", b"\r\n") + b"\n   \n" + _line(chat)
    problems, validator = _problems(data)
    assert problems == [] and validator.summary.valid and validator.summary.records == 2
    assert [r.id for r in read_records(io.BytesIO(data))] == ["w-1", "w-2"]


def test_reading_records_stops_at_the_first_bad_line_and_names_it() -> None:
    """A BOM is skipped on the first line only; the first bad line's problem is the error."""
    assert [r.id for r in read_records(io.BytesIO(_line(GOOD)))] == ["w-1"]
    with pytest.raises(ValueError, match=r"^line 2: metadata: Field required"):
        list(read_records(io.BytesIO(_line(GOOD) + b'{"id": "x"}\n')))
    with pytest.raises(ValueError, match=r"^line 2: not valid JSON"):
        list(read_records(io.BytesIO(_line(GOOD) + b"\xef\xbb\xbf" + _line(GOOD))))
    too_long = _line({**GOOD, "id": "big", "pad": "x" * MAX_LINE_BYTES})
    with pytest.raises(ValueError, match=rf"^line 1: longer than {MAX_LINE_BYTES} bytes$"):
        list(read_records(io.BytesIO(too_long)))


def test_problem_counts_read_as_english() -> None:
    assert [counted(n, "problem") for n in (0, 1, 2)] == ["0 problems", "1 problem", "2 problems"]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"not json", "line 1: not valid JSON (expected ident at column 2)"),
        (b"[1, 2]", 'line 1: not a JSON object; each line must be {"id": ..., "metadata": {...}}'),
        (b"\xff\xfe{}", "line 1: not valid UTF-8 (byte 1)"),
        (_line({"metadata": {"prompt": "p"}}), "line 1: id: Field required"),
        (
            _line({"id": "", "metadata": {"prompt": "p"}}),
            "line 1: id: must not be empty or only whitespace",
        ),
        (
            _line({"id": " \t ", "metadata": {"prompt": "p"}}),
            "line 1: id: must not be empty or only whitespace",
        ),
        (
            _line({"id": 7, "metadata": {"prompt": "p"}}),
            "line 1: id: Input should be a valid string",
        ),
        (_line({"id": "a"}), "line 1: metadata: Field required"),
        (_line({"id": "a", "metadata": 5}), "line 1: metadata: must be a JSON object"),
        (
            _line({"id": "a", "metadata": {}}),
            "line 1: metadata.prompt: " + PROMPT_REQUIRED,
        ),
        (
            _line({"id": "a", "metadata": {"prompt": 5}}),
            "line 1: metadata.prompt: must be a string or a list of chat messages",
        ),
        (
            _line({"id": "a", "metadata": {"prompt": "  "}}),
            "line 1: metadata.prompt: must not be empty",
        ),
        (
            _line({"id": "a", "metadata": {"prompt": []}}),
            "line 1: metadata.prompt: must have at least one message",
        ),
        (
            _line({"id": "a", "metadata": {"prompt": [{"role": "robot", "content": "x"}]}}),
            "line 1: metadata.prompt.0.role: Input should be 'system', 'user', 'assistant' or "
            "'tool'",
        ),
        (
            _line({"id": "a", "metadata": {"prompt": "p", "answer": 5}}),
            "line 1: metadata.answer: Input should be a valid string",
        ),
        (
            _line({"id": "a", "metadata": {"prompt": "p", "info": "x"}}),
            "line 1: metadata.info: must be an object or a string of JSON text (Expecting value "
            "at character 1)",
        ),
        (
            # JSON text nested past what Python's parser takes (it raises RecursionError).
            _line({"id": "a", "metadata": {"prompt": "p", "info": "[" * 100_000 + "]" * 100_000}}),
            "line 1: metadata.info: must be an object or a string of JSON text (nested too deeply "
            "to parse: flatten it)",
        ),
        (
            _line({"id": "a", "metadata": {"prompt": "p"}, "answer": "x"}),
            "line 1: answer: not allowed here (a record has id, metadata, and optionally "
            "messages and tools)",
        ),
        (
            _line({"id": "a", "metadata": {"prompt": "p", "level": 2}}),
            "line 1: metadata.level: not allowed in metadata (prompt, problem, answer, task, "
            "info): put other data in info",
        ),
        (
            _line({"id": "a", "metadata": {"prompt": [{"role": "user", "content": " "}]}}),
            "line 1: metadata.prompt.0: a user message needs non-empty content",
        ),
        (
            _line({"id": "a", "metadata": {"prompt": [{"role": "assistant"}]}}),
            "line 1: metadata.prompt.0: an assistant message needs content or tool_calls",
        ),
        (
            _line({"id": "a", "metadata": {"prompt": [{"role": "tool", "content": "42"}]}}),
            "line 1: metadata.prompt.0: a tool message needs the tool_call_id it answers",
        ),
        (
            _line(
                {
                    "id": "a",
                    "metadata": {"prompt": "p"},
                    "messages": [
                        {
                            "role": "assistant",
                            "tool_calls": [{"id": "c1", "type": "function", "function": {}}],
                        }
                    ],
                }
            ),
            "line 1: messages.0.tool_calls.0.function: needs name and arguments",
        ),
    ],
)
def test_each_fault_is_one_problem_naming_the_line_and_the_field(
    line: bytes, expected: str
) -> None:
    problems, validator = _problems(line)
    assert problems == [expected]
    assert (validator.summary.lines, validator.summary.problems) == (1, 1)


def test_what_aws_accepts_beyond_plain_text_prompts_is_accepted_and_passed_on() -> None:
    """`info` as JSON text (even "null"), an assistant turn of tool calls only, and the BYOO data
    preparation's form: top-level messages and tools, and a problem instead of a prompt."""
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    records = [
        {"id": " t-1 ", "metadata": {"prompt": "p", "info": "null"}},
        {
            "id": "t-2",
            "metadata": {
                "prompt": [
                    {"role": "user", "content": "look it up"},
                    {"role": "assistant", "tool_calls": calls},
                    {"role": "tool", "tool_call_id": "c1", "content": "found"},
                ]
            },
        },
        {
            "id": "wordle_001",
            "messages": [],
            "tools": [{"type": "function", "function": {"name": "guess"}}],
            "metadata": {"answer": "crane", "problem": "Guess: crane"},
        },
        {
            "id": "t-4",
            "messages": [{"role": "system", "content": "Be brief."}],
            "metadata": {"problem": "p"},
        },
    ]
    data = b"".join(_line(record) for record in records)
    assert _problems(data)[0] == []
    read = list(read_records(io.BytesIO(data)))
    assert [record.id for record in read] == ["t-1", "t-2", "wordle_001", "t-4"]
    assert read[3].rollout_data() == {
        "problem": "p",
        "messages": [{"role": "system", "content": "Be brief."}],
    }
    assert read[0].rollout_data() == {"prompt": "p", "info": "null"}
    assert read[1].rollout_data()["prompt"][1] == {"role": "assistant", "tool_calls": calls}
    assert read[2].rollout_data() == {
        "answer": "crane",
        "problem": "Guess: crane",
        "tools": [{"type": "function", "function": {"name": "guess"}}],
    }


def test_ids_are_compared_as_aws_keeps_them_trimmed() -> None:
    problems, _ = _problems(_line(GOOD) + _line({**GOOD, "id": " w-1\t"}))
    assert problems == ["line 2: id: duplicate of the id on line 1"]
    assert DatasetRecord.model_validate({**GOOD, "id": " w-1 "}).id == "w-1"


def test_duplicate_ids_point_at_the_first_one() -> None:
    """Every later copy names the first line with that id, not the copy before it."""
    other = _line({**GOOD, "id": "w-9"})
    data = _line(GOOD) + other + b"\n" + _line(GOOD) + other + _line(GOOD)
    problems, validator = _problems(data)
    assert problems == [
        "line 4: id: duplicate of the id on line 1",
        "line 5: id: duplicate of the id on line 2",
        "line 6: id: duplicate of the id on line 1",
    ]
    assert validator.summary.duplicate_ids == 3


def test_a_dataset_of_two_copies_of_one_record_is_a_duplicate() -> None:
    problems, validator = _problems(_line(GOOD) + _line(GOOD))
    assert problems == ["line 2: id: duplicate of the id on line 1"]
    assert validator.summary.duplicate_ids == 1


def test_problems_come_in_line_order_and_the_first_ones_are_kept() -> None:
    """Duplicates are found at the end of the file but told where they are."""
    many = [_line({**GOOD, "id": f"r{i % 40}"}) for i in range(120)]  # ids 0-39, three times
    data = b"".join(many[:50]) + b"oops\n" + b"".join(many[50:])
    problems, validator = _problems(data)
    lines = [int(problem.split(":")[0].removeprefix("line ")) for problem in problems]
    assert lines == sorted(lines) and 51 in lines and len(problems) == 81
    assert problems[lines.index(51)] == "line 51: not valid JSON (expected value at column 1)"
    # Each copy names the first line of its id, however the ids sorted.
    assert problems[0] == "line 41: id: duplicate of the id on line 1"
    assert problems[-1] == "line 121: id: duplicate of the id on line 40"
    kept, validator = _problems(data, keep=3)
    assert kept == problems[:3] and validator.summary.problems == 81


def test_size_limits_per_line_and_per_file() -> None:
    long = _line({"id": "big", "metadata": {"prompt": "x" * 5000}})  # 5x the limit
    data = _line(GOOD) + long + b"oops\n" + _line({**GOOD, "id": "after"})
    problems, validator = _problems(data, max_line_bytes=1000)
    assert problems == [
        "line 2: longer than 1000 bytes",
        "line 3: not valid JSON (expected value at column 1)",
    ]
    assert (validator.summary.records, validator.summary.lines) == (2, 4)
    assert validator.summary.bytes == len(data)
    # A line of exactly the limit is taken, whatever its line end; one byte more is not.
    exact = _line({"id": "e", "metadata": {"prompt": "p"}}).rstrip(b"\n")
    assert _problems(exact + b"\r\n", max_line_bytes=len(exact))[0] == []
    assert _problems(exact + b"\n", max_line_bytes=len(exact) - 1)[0] == [
        f"line 1: longer than {len(exact) - 1} bytes"
    ]
    three = _line(GOOD) + _line({**GOOD, "id": "2"}) + _line({**GOOD, "id": "3"})
    assert _problems(three, max_file_bytes=len(three))[0] == []
    assert _problems(three, max_file_bytes=len(three) - 1)[0] == [
        f"file: larger than {len(three) - 1} bytes; split the dataset"
    ]


def test_the_files_own_problems_come_first_then_each_lines_in_field_order() -> None:
    problems, _ = _problems(b"{}\n" + _line(GOOD) * 3, max_file_bytes=100)
    assert problems == [
        "file: larger than 100 bytes; split the dataset",
        "line 1: id: Field required",
        "line 1: metadata: Field required",
    ]


def test_an_empty_file_is_invalid() -> None:
    problems, validator = _problems(b"\n \r\n")
    assert (
        problems == ["file: no records: the file is empty or only blank lines"]
        and not validator.summary.valid
    )


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.binary(max_size=80)
        | st.sampled_from([_line(GOOD), b"{}", b'{"id":"x","metadata":{"prompt":"p"}}']),
        max_size=12,
    )
)
def test_garbage_never_raises_and_every_problem_has_a_line(lines: list[bytes]) -> None:
    data = b"\n".join(line.replace(b"\n", b" ") for line in lines)
    validator = DatasetValidator()
    problems = list(validator.problems(io.BytesIO(data)))
    total = data.count(b"\n") + 1
    assert all(problem.line is None or 1 <= problem.line <= total for problem in problems)
    assert validator.summary.valid == (not problems and validator.summary.records > 0)


def test_memory_does_not_grow_with_line_length(tmp_path: Path) -> None:
    # A 20 MB single-line file is read in bounded chunks, not in one piece.
    path = tmp_path / "one-line.jsonl"
    with path.open("wb") as out:
        for _ in range(20):
            out.write(b"x" * 1024 * 1024)
    reads = []

    class Counting(io.FileIO):
        def readline(self, size: int = -1) -> bytes:
            chunk = super().readline(size)
            reads.append(len(chunk))
            return chunk

    validator = DatasetValidator()
    with Counting(path, "rb") as stream:
        problems = [str(p) for p in validator.problems(stream)]
    assert problems[0] == f"line 1: longer than {1024 * 1024} bytes"
    assert max(reads) <= 1024 * 1024 + 2


runner = CliRunner()


def test_cli_valid_invalid_and_usage_exit_codes(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_bytes(_line(GOOD))
    bad.write_bytes(_line(GOOD) + b"oops\n" + _line({"id": "x", "metadata": {}}))
    result = runner.invoke(app, ["validate", str(good)])
    assert result.exit_code == 0 and "valid, 1 record\n" in result.output
    result = runner.invoke(app, ["validate", str(bad)])
    assert result.exit_code == 1
    assert result.output.splitlines()[:3] == [
        "line 2: not valid JSON (expected value at column 1)",
        "line 3: metadata.prompt: " + PROMPT_REQUIRED,
        f"{bad}: invalid, 2 problems in 3 lines",
    ]
    assert "Traceback" not in result.output
    result = runner.invoke(app, ["validate", str(tmp_path / "missing.jsonl")])
    assert result.exit_code == 2 and "no such file" in result.output
    result = runner.invoke(app, ["validate", str(tmp_path)])
    assert result.exit_code == 2


def test_cli_json_output(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(_line({"id": "x", "metadata": {}}))
    result = runner.invoke(app, ["validate", str(bad), "--json"])
    report = json.loads(result.output)
    assert result.exit_code == 1 and report["valid"] is False
    assert report["problems"] == [
        {"line": 1, "field": "metadata.prompt", "message": PROMPT_REQUIRED}
    ]


def test_the_wordle_example_dataset_is_valid() -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "wordle" / "train.jsonl"
    validator = DatasetValidator()
    with example.open("rb") as stream:
        assert [str(p) for p in validator.problems(stream)] == []
    assert validator.summary.records == 256
