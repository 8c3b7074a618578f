"""`mtrl local --trainer llm`: the whole offline pipeline with the open-weights trainer and a
real (tiny, random) language model in place of the local policy. It succeeds and writes what a
deployed run writes: metrics in the same schema, Hugging Face checkpoints with their manifest,
the held-out evaluation before and after, trajectories with policy versions. That it learns is
tested in-process, where sampling is reproducible (tests/llm_trainer/test_trainer.py): through
the pipeline the batches the generation service sees vary with timing, and how fast a random
model climbs varies with them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from domain.evaluation import SAMPLE_PREFIX
from mtrl.cli import app
from mtrl.local.run import LocalRunError, LocalRunOptions, prepare, run_local
from tests.conftest import Synthesized
from tests.readme import document_with

EXAMPLE = Path(__file__).parents[2] / "examples" / "letters"
STEPS = 4  # a checkpoint a step: the oldest pruned, three kept, and the final one


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """The example, shorter, with its environment's path made absolute (workers' cwd)."""
    settings = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    settings.update(max_steps=STEPS, environment=str(EXAMPLE / "letters.py"))
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path


def _run(tmp_path: Path, config: Path, app: Synthesized, **options: Any) -> Path:
    """The example through the whole pipeline with the tiny model: its run's directory, once
    it succeeded and left nothing behind."""
    outcome, directory = run_local(
        LocalRunOptions(
            EXAMPLE / "train.jsonl",
            config=str(config),
            out_dir=tmp_path / "runs",
            trainer="llm",
            model="tiny",
            **options,
        ),  # fmt: skip
        template=app.template("pipeline"),
        timeout_seconds=600,
    )
    assert outcome.status == "SUCCEEDED", (outcome.error, outcome.cause)
    assert not any(outcome.leftover.values()), outcome.leftover
    return directory


def test_a_tiny_language_model_trains_through_the_whole_pipeline(
    tmp_path: Path, config: Path, default_app: Synthesized
) -> None:
    directory = _run(tmp_path, config, default_app)
    outputs = directory / "outputs"
    lines = [json.loads(line) for line in (outputs / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(1, STEPS + 1))
    # The worker read the trainer's finish reasons: cut replies are counted as truncated.
    assert all(line["truncated_rollouts"] > 0 for line in lines)
    manifest = json.loads((outputs / "checkpoints" / "manifest.json").read_text())
    # A checkpoint a step, the newest three kept (grpo.keep_checkpoints), and the final one.
    assert [c["step"] for c in manifest["checkpoints"]] == [STEPS - 2, STEPS - 1, STEPS, STEPS]
    final = outputs / "checkpoints" / "final"
    assert {"config.json", "model.safetensors"} <= {p.name for p in final.iterdir()}
    states = sorted(p.name for p in (outputs / "checkpoints" / "trainer-state").iterdir())
    assert states == ["final.pt", *(f"step-{step:06d}.pt" for step in range(STEPS - 2, STEPS + 1))]
    report = json.loads((directory / "report.json").read_text())
    evaluation = report["evaluation"]
    assert evaluation["baseline"]["n"] == evaluation["final"]["n"] == 8
    trajectories = pd.read_parquet(outputs / "trajectories")
    evaluated = trajectories["sample_id"].str.startswith(SAMPLE_PREFIX)
    trained = trajectories[~evaluated]
    assert len(trained) == STEPS * 16
    assert set(trained["policy_version"]) == set(range(STEPS))  # step s played by version s - 1
    # The baseline is the untrained model (version 0), the final one trained STEPS steps: each
    # evaluation's sample numbers are its own (domain/evaluation.py), 0-1 and 2-3.
    numbers = trajectories[evaluated]["sample_id"].str.rsplit("_", n=1).str[1].astype(int)
    versions = trajectories[evaluated]["policy_version"]
    assert set(versions[numbers < 2]) == {0} and set(versions[numbers >= 2]) == {STEPS}


def test_two_trainer_processes_generate_and_train_together_through_the_pipeline(
    tmp_path: Path, config: Path, default_app: Synthesized
) -> None:
    """As on a node's GPUs: torchrun starts two trainer processes (gloo on the CPU); both answer
    generate requests and train on their share of each step; the first writes the outputs."""
    directory = _run(tmp_path, config, default_app, max_steps=4, processes=2)
    log = (directory / "logs" / "trainer.log").read_text()
    assert "process 1 of 2: generating and training, weights sharded" in log
    assert "process 2 of 2: generating and training, weights sharded" in log
    # The second process answered its share of the model turns (the queue hands each request
    # to one of them), and what it sampled was trained on with the rest.
    (answered,) = re.findall(r"process 2 of 2: answered (\d+) generate requests", log)
    assert int(answered) > 0
    outputs = directory / "outputs"
    lines = [json.loads(line) for line in (outputs / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3, 4]
    assert all(line["sequences"] > 0 for line in lines)
    manifest = json.loads((outputs / "checkpoints" / "manifest.json").read_text())
    assert [c["name"] for c in manifest["checkpoints"]][-1] == "final"
    report = json.loads((directory / "report.json").read_text())
    assert report["evaluation"]["baseline"]["n"] == report["evaluation"]["final"]["n"] == 8
    trajectories = pd.read_parquet(outputs / "trajectories")
    trained = trajectories[~trajectories["sample_id"].str.startswith(SAMPLE_PREFIX)]
    assert len(trained) == 4 * 16 and set(trained["policy_version"]) == {0, 1, 2, 3}


@pytest.mark.parametrize(
    ("model", "problem"),
    [
        ("/no/such/model", "no such directory"),
        ("s3://bucket/model/", "a local run cannot read S3"),
        (".", "not a model directory"),
    ],
)
def test_a_model_it_cannot_load_is_refused_before_anything_starts(
    model: str, problem: str, config: Path
) -> None:
    options = LocalRunOptions(
        EXAMPLE / "train.jsonl", config=str(config), trainer="llm", model=model
    )
    with pytest.raises(LocalRunError, match=problem):
        prepare(options)


def test_without_the_llm_extra_it_says_what_to_install(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        "mtrl.local.run.find_spec", lambda name: None if name == "peft" else object()
    )
    options = LocalRunOptions(EXAMPLE / "train.jsonl", config=str(config), trainer="llm")
    with pytest.raises(
        LocalRunError, match=r"--trainer llm needs peft: pip install -e '\.\[llm\]'"
    ):
        prepare(options)


def test_several_trainer_processes_are_for_the_language_model_trainer_only() -> None:
    result = CliRunner().invoke(
        app, ["local", str(EXAMPLE / "train.jsonl"), "--trainer-processes", "2"]
    )
    assert result.exit_code == 2
    assert "--trainer-processes 2: only with --trainer llm" in result.output


def test_a_tiny_language_model_trains_on_a_typed_action_openenv_server(
    tmp_path: Path, default_app: Synthesized, openenv: dict[str, str]
) -> None:
    """A real OpenEnv server whose action is typed (`{"action": "UP" | ...}`, read from its
    /schema), records written by `mtrl env records`: the run succeeds, and the random model's
    malformed moves are its scored moves (reward 0, counted as invalid), never environment
    errors."""
    url = ["--arg", f"url={openenv['grid']}"]
    dataset = tmp_path / "grid.jsonl"
    written = CliRunner().invoke(
        app, ["env", "records", "openenv", *url, "--count", "12", "--out", str(dataset)]
    )
    assert written.exit_code == 0, written.output
    settings = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    settings.update(
        max_steps=2, max_turns=3, rollout_concurrency=4, eval_fraction=0, environment="openenv",
        environment_args={"url": openenv["grid"], "max_sessions": 4, "max_turns": 3},
    )  # fmt: skip
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(settings))
    outcome, directory = run_local(
        LocalRunOptions(
            dataset, config=str(config), out_dir=tmp_path / "runs", trainer="llm", model="tiny"
        ),
        template=default_app.template("pipeline"),
        timeout_seconds=600,
    )
    assert outcome.status == "SUCCEEDED", (outcome.error, outcome.cause)
    assert not any(outcome.leftover.values()), outcome.leftover
    lines = [json.loads(line) for line in (directory / "metrics.jsonl").read_text().splitlines()]
    assert [(line["env_error_rollouts"], line["failed_rollouts"]) for line in lines] == [(0, 0)] * 2
    trajectories = pd.read_parquet(directory / "outputs" / "trajectories")
    invalid = [dict(metrics).get("env/invalid") for metrics in trajectories["metrics"]]
    assert len(invalid) == 2 * 16 and all(count is not None for count in invalid)
    assert sum(invalid) > 0  # a random model's replies are not moves: scored, and counted
    first = json.loads(trajectories["messages"].iloc[0])[0]["content"]
    assert first.startswith("Each reply is your move (the action's action: one of UP, DOWN")


def _readme_block(after: str) -> list[str]:
    """The command lines of the documents' first code block after the line starting `after`."""
    text = document_with(after).read_text()
    block = text[text.index(after) :].split("```\n", 2)[1]
    return [line for line in block.splitlines() if line.strip()]


def test_the_readmes_bring_your_own_steps_train_a_new_environment(
    tmp_path: Path, default_app: Synthesized, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The docs' steps from `mtrl env new` to a local training run, as a newcomer types them
    in a clone (its `examples/` beside them): each succeeds untouched. The local run is cut to
    two steps (`--steps 2`) and given the synthesized pipeline the tests share; the install
    line is what this module's tests already need."""
    import shlex
    import subprocess

    import mtrl.local.run

    commands = _readme_block("From a new environment to a local training run")
    assert commands[-1].startswith("mtrl local ") and any("pip install" in c for c in commands)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples").symlink_to(EXAMPLE.parent)
    monkeypatch.setattr(
        mtrl.local.run, "pipeline_template", lambda: default_app.template("pipeline")
    )
    for command in commands:
        if command.startswith("pip install"):
            continue
        if not command.startswith("mtrl "):
            done = subprocess.run(command, shell=True, capture_output=True, text=True, check=False)
            assert done.returncode == 0, f"{command}: {done.stderr}"
            continue
        arguments = shlex.split(command, comments=True)[1:]
        if arguments[0] == "local":
            arguments += ["--steps", "2", "--out", str(tmp_path / "runs")]
        typed = "50\n" * 10 if arguments[:2] == ["env", "play"] else None
        result = CliRunner().invoke(app, arguments, input=typed)
        assert result.exit_code == 0, f"{command}: {result.output}"
    (report,) = (tmp_path / "runs").glob("*/report.json")
    assert json.loads(report.read_text())["status"] == "SUCCEEDED"
