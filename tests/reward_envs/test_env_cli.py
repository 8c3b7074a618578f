"""`mtrl env check / new / play`: output and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mtrl.cli import app
from mtrl.commands.env import _as_typed

runner = CliRunner()

BROKEN = """
from reward_envs.wordle import WordleEnvironment

class Broken(WordleEnvironment):
    name = "broken"
    def aggregate(self, turn_rewards):
        return 5.0

def load_environment():
    return Broken()
"""


def test_check_wordle_passes() -> None:
    result = runner.invoke(app, ["env", "check", "reward_envs.wordle", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["passed"] is True and len(report["checks"]) == 9


def test_check_fails_a_broken_environment_with_exit_1(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text(BROKEN)
    result = runner.invoke(app, ["env", "check", str(tmp_path / "broken.py")])
    assert result.exit_code == 1
    assert "FAIL" in result.output and "outside" in result.output


def test_check_unknown_environment_is_a_usage_error() -> None:
    result = runner.invoke(app, ["env", "check", "nope_not_here"])
    assert result.exit_code == 2
    assert "no such module or registered environment" in result.output


def test_check_with_a_dataset(tmp_path: Path) -> None:
    data = tmp_path / "records.jsonl"
    data.write_text(
        '{"id": "a", "metadata": {"answer": "crane"}}\n\n{"id": "b", "metadata": {"answer": "lapel"}}\n'
    )
    assert runner.invoke(app, ["env", "check", "wordle", "--data", str(data)]).exit_code == 0
    data.write_text('{"id": "a", "metadata": {"answer": "crane"}}\nnot json\n')
    result = runner.invoke(app, ["env", "check", "wordle", "--data", str(data)])
    assert result.exit_code == 2 and "line 2" in result.output


def test_new_writes_a_package_that_passes_check_and_its_own_tests(tmp_path: Path) -> None:
    result = runner.invoke(app, ["env", "new", "demo", "--dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    project = tmp_path / "demo"
    assert (project / "demo" / "environment.py").is_file() and (
        project / "tests" / "test_environment.py"
    ).is_file()
    check = runner.invoke(app, ["env", "check", str(project / "demo")])
    assert check.exit_code == 0, check.output
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert "2 passed" in tests.stdout
    # Its code passes the same lint as ours, wherever it is made (its pyproject says how).
    for lint in (["check"], ["format", "--check"]):
        linted = subprocess.run(
            [sys.executable, "-m", "ruff", *lint, "."], cwd=project, capture_output=True, text=True
        )
        assert linted.returncode == 0, linted.stdout + linted.stderr


def test_new_then_check_as_a_newcomer_types_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`mtrl env new NAME`, then the command it prints: the project folder is found to hold its
    package (NAME/NAME), by name or as a path."""
    monkeypatch.chdir(tmp_path)
    made = runner.invoke(app, ["env", "new", "newcomer"])
    assert made.exit_code == 0, made.output
    assert "env check newcomer " in " ".join(made.output.split())
    for spec in ("newcomer", "./newcomer", str(tmp_path / "newcomer")):
        check = runner.invoke(app, ["env", "check", spec, "--episodes", "2"])
        assert check.exit_code == 0, f"{spec}: {check.output}"
    (tmp_path / "empty").mkdir()
    result = runner.invoke(app, ["env", "check", "./empty"])
    assert result.exit_code == 2 and "no Python package in it" in result.output
    for package in ("one", "two"):
        (tmp_path / "many" / package).mkdir(parents=True)
        (tmp_path / "many" / package / "__init__.py").write_text("")
    result = runner.invoke(app, ["env", "check", "./many"])
    assert result.exit_code == 2 and "several packages (one, two)" in result.output


def test_a_fresh_environment_plays_and_writes_a_valid_dataset_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`mtrl env new X`, then `mtrl env play X` (its example record: no KeyError for a missing
    answer) and `mtrl env records X`, whose lines `mtrl validate` takes, each with a prompt and
    a text answer; a won episode says so (`success`)."""
    monkeypatch.chdir(tmp_path)
    assert runner.invoke(app, ["env", "new", "fresh"]).exit_code == 0
    played = runner.invoke(app, ["env", "play", "fresh"], input="50\n" * 7)
    assert played.exit_code == 0, played.output
    assert "episode reward:" in played.output and "Traceback" not in played.output
    written = runner.invoke(app, ["env", "records", "fresh", "--count", "8", "--out", "d.jsonl"])
    assert written.exit_code == 0, written.output
    validated = runner.invoke(app, ["validate", "d.jsonl"])
    assert validated.exit_code == 0, validated.output
    lines = [json.loads(line) for line in (tmp_path / "d.jsonl").read_text().splitlines()]
    assert len(lines) == 8 and all(isinstance(line["metadata"]["answer"], str) for line in lines)
    assert all(line["metadata"]["prompt"] for line in lines)
    sys.path.insert(0, str(tmp_path / "fresh"))
    try:
        from fresh import load_environment  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(tmp_path / "fresh"))
    environment = load_environment()
    (record,) = environment.example_records(1)
    episode, _ = environment.reset(record)
    assert episode.step(record.metadata["answer"]).info["success"] is True


def test_the_next_steps_name_programs_as_they_can_be_run_from_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    program = tmp_path / "venv" / "bin" / "tool"
    program.parent.mkdir(parents=True)
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert _as_typed(program, "tool") == "venv/bin/tool"  # not on PATH: its path from here
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert _as_typed(program, "tool") == str(program)
    monkeypatch.setenv("PATH", str(program.parent))
    assert _as_typed(program, "tool") == "tool"  # what PATH finds (an active venv)


@pytest.mark.parametrize("name", ["Demo", "my-env", "1env"])
def test_new_refuses_names_that_are_not_packages(tmp_path: Path, name: str) -> None:
    result = runner.invoke(app, ["env", "new", name, "--dir", str(tmp_path)])
    assert result.exit_code == 2 and "not a package name" in result.output


def test_new_never_overwrites(tmp_path: Path) -> None:
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "keep.txt").write_text("mine")
    result = runner.invoke(app, ["env", "new", "demo", "--dir", str(tmp_path)])
    assert result.exit_code == 2 and "already exists" in result.output
    assert (tmp_path / "demo" / "keep.txt").read_text() == "mine"


def test_play_wordle_by_hand() -> None:
    result = runner.invoke(
        app, ["env", "play", "wordle", "--answer", "crane"], input="[slate]\ncrane\n"
    )
    assert result.exit_code == 0, result.output
    assert "SLATE: X X G X G" in result.output
    assert "Solved in 2 guesses." in result.output
    assert "episode reward: 0.900" in result.output


def test_a_first_guess_win_is_one_guess() -> None:
    result = runner.invoke(app, ["env", "play", "wordle", "--answer", "crane"], input="[crane]\n")
    assert "Solved in 1 guess." in result.output, result.output


def test_play_shows_the_environments_text_as_it_is() -> None:
    """`[crane]` is the answer format, not console markup: it shows in the rules and after an
    invalid guess."""
    result = runner.invoke(app, ["env", "play", "wordle", "--answer", "crane"], input="[hi]\n")
    assert result.output.count("for example [crane].") == 2, result.output
    assert "Invalid guess: 'hi' has 2 letters, not 5." in result.output


def test_play_rejects_a_bad_answer() -> None:
    result = runner.invoke(app, ["env", "play", "wordle", "--answer", "cat"])
    assert result.exit_code == 2 and "five-letter word" in result.output


def test_records_writes_a_valid_dataset_from_the_seed(tmp_path: Path) -> None:
    """`mtrl env records`: the environment's example records as Nova dataset lines, with its
    tools; the shipped support-desk example is exactly what it writes."""
    out = tmp_path / "desk.jsonl"
    result = runner.invoke(
        app, ["env", "records", "support_desk", "--count", "128", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    example = Path(__file__).parents[2] / "examples" / "support_desk" / "train.jsonl"
    assert out.read_text() == example.read_text()
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 128 and {tool["function"]["name"] for tool in lines[0]["tools"]} >= {
        "get_order", "finish",
    }  # fmt: skip
    assert runner.invoke(app, ["validate", str(out)]).exit_code == 0
    wordle = runner.invoke(app, ["env", "records", "wordle", "--count", "3", "--seed", "2"])
    assert wordle.exit_code == 0
    assert [json.loads(line).keys() for line in wordle.output.splitlines()] == [
        {"id", "metadata"}
    ] * 3
    (tmp_path / "bare.py").write_text(
        "from reward_envs.interface import Environment\n"
        "class Bare(Environment):\n"
        "    def reset(self, record, *, seed=0):\n"
        "        raise NotImplementedError\n"
        "def load_environment():\n"
        "    return Bare()\n"
    )
    bare = runner.invoke(app, ["env", "records", str(tmp_path / "bare.py")])
    assert bare.exit_code == 2 and "no example records" in bare.output
