"""The dataset schema and `mtrl validate`: line-numbered problems, streaming, exit codes."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from domain.dataset import MAX_LINE_BYTES, DatasetValidator, counted_problems, read_records
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
    with pytest.raises(ValueError, match=r"^line 2: line: not valid JSON"):
        list(read_records(io.BytesIO(_line(GOOD) + b"\xef\xbb\xbf" + _line(GOOD))))
    too_long = _line({**GOOD, "id": "big", "pad": "x" * MAX_LINE_BYTES})
    with pytest.raises(ValueError, match=rf"^line 1: longer than {MAX_LINE_BYTES} bytes$"):
        list(read_records(io.BytesIO(too_long)))


def test_problem_counts_read_as_english() -> None:
    assert [counted_problems(n) for n in (0, 1, 2)] == ["0 problems", "1 problem", "2 problems"]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"not json", "line 1: line: not valid JSON (expected ident at column 2)"),
        (
            b"[1, 2]",
            'line 1: line: not a JSON object; each line must be {"id": ..., "metadata": {...}}',
        ),
        (b"\xff\xfe{}", "line 1: line: not valid UTF-8 (byte 1)"),
        (_line({"metadata": {"prompt": "p"}}), "line 1: id: Field required"),
        (
            _line({"id": "", "metadata": {"prompt": "p"}}),
            "line 1: id: String should have at least 1 character",
        ),
        (
            _line({"id": 7, "metadata": {"prompt": "p"}}),
            "line 1: id: Input should be a valid string",
        ),
        (
            _line({"id": "a\tb", "metadata": {"prompt": "p"}}),
            "line 1: id: must not contain control characters",
        ),
        (_line({"id": "a"}), "line 1: metadata: Field required"),
        (_line({"id": "a", "metadata": {}}), "line 1: metadata.prompt: Field required"),
        (_line({"id": "a", "metadata": {"prompt": "  "}}), "line 1: metadata: prompt is empty"),
        (
            _line({"id": "a", "metadata": {"prompt": []}}),
            "line 1: metadata: prompt has no messages",
        ),
        (
            _line({"id": "a", "metadata": {"prompt": [{"role": "robot", "content": "x"}]}}),
            "line 1: metadata.prompt.list[ChatMessage].0.role",
        ),
        (
            _line({"id": "a", "metadata": {"prompt": "p", "answer": 5}}),
            "line 1: metadata.answer: Input should be a valid string",
        ),
        (
            _line({"id": "a", "metadata": {"prompt": "p", "info": "x"}}),
            "line 1: metadata.info: Input should be an object",
        ),
        (
            _line({"id": "a", "metadata": {"prompt": "p"}, "answer": "x"}),
            "line 1: answer: not allowed here",
        ),
    ],
)
def test_each_problem_names_the_line_and_the_field(line: bytes, expected: str) -> None:
    problems, _ = _problems(line)
    assert any(p.startswith(expected) for p in problems), problems


def test_duplicate_ids_point_at_the_first_one() -> None:
    """Every later copy names the first line with that id, not the copy before it."""
    other = _line({**GOOD, "id": "w-9"})
    data = _line(GOOD) + other + b"\n" + _line(GOOD) + other + _line(GOOD)
    problems, validator = _problems(data)
    assert sorted(problems) == [
        "line 4: id: duplicate of the id on line 1",
        "line 5: id: duplicate of the id on line 2",
        "line 6: id: duplicate of the id on line 1",
    ]
    assert validator.summary.duplicate_ids == 3


def test_size_limits_per_line_and_per_file() -> None:
    long = _line({"id": "big", "metadata": {"prompt": "x" * 5000}})
    problems, _ = _problems(
        _line(GOOD) + long + _line({**GOOD, "id": "after"}), max_line_bytes=1000
    )
    assert problems == ["line 2: line: longer than 1000 bytes"]
    problems, _ = _problems(_line(GOOD) * 3, max_file_bytes=150)
    assert problems[-1] == "file: larger than 150 bytes; split the dataset"


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
    assert problems[0] == f"line 1: line: longer than {1024 * 1024} bytes"
    assert max(reads) <= 1024 * 1024 + 2


runner = CliRunner()


def test_cli_valid_invalid_and_usage_exit_codes(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_bytes(_line(GOOD))
    bad.write_bytes(_line(GOOD) + b"oops\n" + _line({"id": "x", "metadata": {}}))
    result = runner.invoke(app, ["validate", str(good)])
    assert result.exit_code == 0 and "valid, 1 records" in result.output
    result = runner.invoke(app, ["validate", str(bad)])
    assert result.exit_code == 1
    assert result.output.splitlines()[:2] == [
        "line 2: line: not valid JSON (expected value at column 1)",
        "line 3: metadata.prompt: Field required",
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
        {"line": 1, "field": "metadata.prompt", "message": "Field required"}
    ]


def test_the_wordle_example_dataset_is_valid() -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "wordle" / "train.jsonl"
    validator = DatasetValidator()
    with example.open("rb") as stream:
        assert [str(p) for p in validator.problems(stream)] == []
    assert validator.summary.records == 256
