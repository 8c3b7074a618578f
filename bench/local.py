"""Local mode (`make demo`): time from upload to the first training step, time per step,
reward at fixed steps, peak memory — against a named baseline run side by side.

Baseline: the same GRPO update and policy with the episodes played in-process (no pipeline, no
queues, no router, no worker processes), i.e. what the learning itself costs. The ratio of the
two per-step times is what running the real protocol locally adds.
Run: `python -m bench.local` (BENCH_RUNS=3 runs, the median reported and written to
bench/results/local.json; BENCH_QUICK=1, as `make test` runs it: one run of one step, without the
held-out evaluations, nothing written). Nothing is asserted.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

import numpy as np
import yaml

from local_trainer.direct import DirectStep, train
from local_trainer.policy import WordlePolicy
from mtrl.local.run import LocalRunOptions, pipeline_template, run_local
from mtrl.local.session import Observer
from reward_envs.interface import Record
from reward_envs.wordle import load_environment, words
from training_configs.schema import load_training_config

EXAMPLE = Path(__file__).parents[1] / "examples" / "wordle"
QUICK = os.environ.get("BENCH_QUICK") == "1"
MARKS = (1, 4, 7, 10)
RUNS = 1 if QUICK else int(os.environ.get("BENCH_RUNS", "3"))
RESULTS = Path(__file__).parent / "results" / "local.json"


def baseline(steps: int, group_size: int, secrets: int, learning_rate: float) -> list[DirectStep]:
    """The same update and policy, the episodes played in-process."""
    records = [Record(f"r{i}", {"answer": word}) for i, word in enumerate(words.answers())]
    return train(
        load_environment(),
        WordlePolicy(),
        records,
        steps=steps,
        group_size=group_size,
        records_per_step=secrets,
        learning_rate=learning_rate,
    )


def one_run(template: dict, steps: int, config: Path) -> dict:
    """One run of the example through the pipeline: its times, rewards and wins per step."""
    uploaded: list[float] = []
    first_step: list[float] = []

    def on_state(state: str) -> None:
        if not uploaded:
            uploaded.append(time.perf_counter())

    def on_step(metrics: dict, total: int) -> None:
        if not first_step:
            first_step.append(time.perf_counter())

    with TemporaryDirectory() as out:
        outcome, _ = run_local(
            LocalRunOptions(
                EXAMPLE / "train.jsonl",
                config=str(config),
                out_dir=Path(out),
                max_steps=steps,
            ),
            template=template,
            observer=Observer(on_state=on_state, on_step=on_step),
        )
    return {
        "status": outcome.status,
        "run_seconds": round(outcome.seconds, 1),
        "first_step_seconds": round(first_step[0] - uploaded[0], 1),
        "step_seconds_median": round(float(np.median([m["seconds"] for m in outcome.metrics])), 2),
        "reward": {m["step"]: round(m["mean_reward"], 3) for m in outcome.metrics},
        "wins": {m["step"]: round(m.get("win_rate") or 0.0, 3) for m in outcome.metrics},
        # Per step: its seconds and the model turns it took (32 episodes x turns per episode).
        "seconds": {m["step"]: round(m["seconds"], 2) for m in outcome.metrics},
        "turns": {
            m["step"]: round(m["turns_per_episode"] * m["rollouts"]) for m in outcome.metrics
        },
    }


def config_of_the_runs(scratch: Path) -> Path:
    """The example's config; in the quick mode, without its held-out evaluations."""
    example = EXAMPLE / "config.yaml"
    if not QUICK:
        return example
    quick = scratch / "config.yaml"
    quick.write_text(yaml.safe_dump(yaml.safe_load(example.read_text()) | {"eval_fraction": 0}))
    return quick


def main() -> None:
    config = load_training_config(EXAMPLE / "config.yaml")
    steps = 1 if QUICK else config.max_steps
    print(f"nova-mtrl local-mode bench — {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    print(
        f"config {config.name}: {steps} steps of {config.global_batch_size} rollouts "
        f"(groups of {config.group_size}), {RUNS} runs"
    )
    started = time.perf_counter()
    template = pipeline_template()
    synth = time.perf_counter() - started
    runs = []
    with TemporaryDirectory() as scratch:
        run_config = config_of_the_runs(Path(scratch))
        for number in range(1, RUNS + 1):
            runs.append(one_run(template, steps, run_config))
            print(f"run {number}: {runs[-1]['status']}, {runs[-1]['run_seconds']} s")
    base = baseline(
        steps,
        config.group_size,
        config.global_batch_size // config.group_size,
        config.local_policy.learning_rate,
    )
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    median = lambda key: float(np.median([run[key] for run in runs]))  # noqa: E731
    local_step, base_step = (
        median("step_seconds_median"),
        float(np.median([s.seconds for s in base])),
    )
    rewards = runs[0]["reward"]
    # What the platform costs per model turn, whatever the demo's learning needs: the steps'
    # wall time over the turns they took (32 episodes at once).
    turn_ms = float(
        np.median(
            [1000 * sum(run["seconds"].values()) / sum(run["turns"].values()) for run in runs]
        )
    )
    print(
        f"whole run (median of {RUNS}): {median('run_seconds'):.0f} s after a {synth:.1f} s synth"
    )
    print(f"upload -> first training step done (median): {median('first_step_seconds'):.1f} s")
    print(
        f"per step (median): local pipeline {local_step:.2f} s, in-process baseline "
        f"{base_step * 1000:.0f} ms; ratio {local_step / base_step:.0f}x"
    )
    print(f"per model turn (median): {turn_ms:.1f} ms of step time")
    print(
        "mean reward at step: "
        + ", ".join(
            f"{mark}: {rewards[mark]:.3f} (baseline {base[mark - 1].mean_reward:.3f})"
            for mark in MARKS
            if mark in rewards
        )
    )
    print(f"peak RSS: this process {own:.0f} MB, largest child {children:.0f} MB")
    if not QUICK:
        RESULTS.write_text(
            json.dumps(
                {
                    "machine": f"{os.cpu_count()} cores, {sys.platform}, Python {sys.version.split()[0]}",
                    "steps": steps,
                    "synth_seconds": round(synth, 1),
                    "run_seconds_median": median("run_seconds"),
                    "first_step_seconds_median": median("first_step_seconds"),
                    "step_seconds_median": local_step,
                    "turn_ms_median": round(turn_ms, 1),
                    "baseline_step_ms": round(base_step * 1000, 1),
                    "peak_rss_mb": {"this process": round(own), "largest child": round(children)},
                    "runs": runs,
                },
                indent=2,
            )
            + "\n"
        )
        print(f"figures in {RESULTS.relative_to(EXAMPLE.parents[1])}")


if __name__ == "__main__":
    main()
