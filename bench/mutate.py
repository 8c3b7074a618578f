"""Mutation testing of the modules where a silent bug costs money or data (`make mutate`).

mutmut plants small bugs (mutants) in each module below (or in the functions FUNCTIONS names),
one at a time, and runs the tests that reach the mutated function; a mutant no test notices survives. This runs mutmut in a copy of
the repository (build/mutate/, so the working tree is never touched), one process at a time per
core, and prints per module: mutants, killed, survived (no test failed), untested (no selected
test reaches the function) and the score, caught / (mutants - equivalent), where a mutant that
makes its tests hang (timeout) counts as caught. Mutants that cannot
be told apart from the original are listed, each with its reason, in
bench/mutation_equivalents.toml. The figures go to bench/results/mutation.json.

Run: `python -m bench.mutate [MODULE ...]` (default: all of MODULES). Not in CI: run it before
resolving an issue that touched these modules.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections import Counter
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "build" / "mutate"
EQUIVALENTS = ROOT / "bench" / "mutation_equivalents.toml"
RESULTS = ROOT / "bench" / "results" / "mutation.json"

# Module -> the test files that exercise it (the fast ones: unit tests and moto, no synth).
MODULES: dict[str, tuple[str, ...]] = {
    "domain/runs.py": ("tests/domain/test_runs.py", "tests/pipeline/test_policies.py"),
    "domain/dataset.py": (
        "tests/mtrl/test_dataset.py",
        "tests/mtrl/test_dataset_against_aws.py",
        "tests/pipeline/test_pipeline_steps.py",
    ),
    # What a Nova job may be given (a wrong override costs a failed GPU run).
    "domain/nova_job.py": (
        "tests/domain/test_nova_job.py",
        "tests/mtrl/test_plan.py",
        "tests/launcher/test_hyperpod_cli.py",
    ),
    "lambdas/pipeline/reaper.py": ("tests/pipeline/test_handlers.py",),
    "lambdas/pipeline/resources.py": (
        "tests/pipeline/test_pipeline_steps.py",
        "tests/pipeline/test_handlers.py",
    ),
    "lambdas/pipeline/policies.py": (
        "tests/pipeline/test_policies.py",
        "tests/pipeline/test_compute.py",
    ),
    "lambdas/pipeline/hyperpod_capacity.py": (
        "tests/pipeline/test_hyperpod_capacity.py",
        "tests/pipeline/test_hyperpod_training.py",
    ),
    # The Nova plane: what AWS's launcher is given, what a retry or a teardown does to a job.
    "lambdas/launcher/hyperpod_cli.py": ("tests/launcher/test_hyperpod_cli.py",),
    "lambdas/pipeline/nova_training.py": ("tests/pipeline/test_nova_training.py",),
    "lambdas/pipeline/training_planes.py": ("tests/pipeline/test_training_planes.py",),
    # What restricted nodes get of the EKS add-ons (a wrong copy leaves a Nova job's pods
    # without network or DNS).
    "domain/rig_addons.py": (
        "tests/kubernetes/test_rig_addons.py",
        "tests/kubernetes/test_chart_install.py",
    ),
    # A Nova run's progress: what stall detection and `mtrl status` read.
    "lambdas/pipeline/reward_curve.py": (
        "tests/pipeline/test_reward_curve.py",
        "tests/pipeline/test_nova_training.py",
    ),
    # How an evaluation rollout ended, as the router keeps it and the statistics read it.
    "domain/episodes.py": (
        "tests/domain/test_evaluation.py",
        "tests/router/test_proxy.py",
        "tests/local/test_held_out.py",
    ),
    # Did it learn: which records are held out, pass@k, the change and its interval.
    "domain/evaluation.py": (
        "tests/domain/test_evaluation.py",
        "tests/pipeline/test_compute.py",
        "tests/local/test_held_out.py",
    ),
    # Where a run starts from, and which checkpoint is released.
    "lambdas/pipeline/checkpoints.py": (
        "tests/pipeline/test_checkpoints.py",
        "tests/pipeline/test_register_notify.py",
        "tests/pipeline/test_compute.py",
    ),
    # What is imported into Bedrock and deployed (a paid endpoint).
    "mtrl/ops/deploy.py": ("tests/mtrl/test_deploy.py",),
    "lambdas/router/proxy.py": ("tests/router/test_proxy.py", "tests/router/test_nova_contract.py"),
    # Run isolation of a Nova trainer's rollout requests: the one run that holds the Lambda.
    "lambdas/router/rollout_forwarder.py": ("tests/router/test_rollout_forwarder.py",),
    "reward_envs/worker/worker.py": ("tests/reward_envs/test_worker.py",),
    # What stops or warns a run (a missed rule costs GPU hours; a false one stops a good run).
    "domain/health.py": ("tests/domain/test_health.py", "tests/pipeline/test_compute.py"),
    # Every rollout kept once, in bounded memory; the record each run leaves in MLflow.
    "domain/trajectories.py": (
        "tests/reward_envs/test_trajectory_store.py",
        "tests/mtrl/test_trajectories_command.py",
    ),
    "reward_envs/worker/trajectory_store.py": ("tests/reward_envs/test_trajectory_store.py",),
    "domain/tracking.py": (
        "tests/local/test_tracking.py",
        "tests/pipeline/test_experiment_tracking.py",
    ),
    # What a conversation is on the wire: a dropped null or tool call breaks every agent run.
    "domain/chat.py": ("tests/domain/test_chat.py", "tests/mtrl/test_dataset.py"),
    # How a model's tool calls reach an environment, and what the agent environment pays.
    "reward_envs/interface.py": (
        "tests/reward_envs/test_reply.py",
        "tests/reward_envs/test_support_desk.py",
        "tests/reward_envs/test_conformance.py",
    ),
    "reward_envs/support_desk/env.py": ("tests/reward_envs/test_support_desk.py",),
    "reward_envs/openenv/env.py": ("tests/reward_envs/test_openenv.py",),
    "local_trainer/grpo.py": ("tests/local/test_grpo.py", "tests/local/test_trainer.py"),
    # The open-weights trainer: which tokens it trains on, and the step's statistics both
    # trainers report (a wrong mask or count trains on the wrong thing silently).
    "llm_trainer/tokens.py": ("tests/llm_trainer/test_tokens.py",),
    "llm_trainer/tool_calls.py": ("tests/llm_trainer/test_tool_calls.py",),
    # A gated model's token: a wrong read starts a GPU job that cannot load its model.
    "llm_trainer/hub_token.py": ("tests/llm_trainer/test_hub_token.py",),
    # The update itself and the log-probabilities it takes: a wrong sign, mask or bound trains
    # the wrong thing, and every trainer test still runs.
    "llm_trainer/grpo.py": (
        "tests/llm_trainer/test_grpo.py",
        "tests/llm_trainer/test_importance_ratio.py",
        "tests/llm_trainer/test_update_metrics.py",
        "tests/llm_trainer/test_update_edges.py",
    ),
    "llm_trainer/logprobs.py": (
        "tests/llm_trainer/test_logprobs.py",
        "tests/llm_trainer/test_grpo.py",
        "tests/llm_trainer/test_importance_ratio.py",
    ),
    "domain/grpo.py": (
        "tests/domain/test_score_groups.py",
        "tests/llm_trainer/test_grpo.py",
        "tests/local/test_grpo.py",
        "tests/local/test_trainer.py",
        "tests/llm_trainer/test_trainer.py",
    ),
    "stacks/components/pipeline_states.py": ("tests/pipeline/test_pipeline_definition.py",),
}
# Modules whose tests start jsii's node process (CDK): a forked child cannot share its parent's,
# so each mutant's tests run in a process that never imported them (mutmut's fork server).
OWN_PROCESS = {"stacks/components/pipeline_states.py"}
# Where only some functions of a module decide money or data, only those are mutated: the
# worker's routing (poison, retry with backoff, dead letter, give back) and its heartbeat; its
# thread and batching plumbing is covered end to end and would only add slow timeouts.
FUNCTIONS: dict[str, tuple[str, ...]] = {
    "reward_envs/worker/worker.py": (
        "RewardWorker._start",
        "RewardWorker._work",
        "RewardWorker._give_back",
        "RewardWorker._retry_or_poison",
        "RewardWorker._poison",
        "RewardWorker._heartbeat",
    ),
    # The definition's builder, not the machine's stack settings (the stack tests' synth).
    "stacks/components/pipeline_states.py": (
        "PipelineDefinition.task",
        "PipelineDefinition.failure_path",
        "PipelineDefinition.caught",
        "PipelineDefinition.poll_until",
        "PipelineDefinition.job_failed",
        "PipelineDefinition.build",
    ),
}
_MUTANT = re.compile(r"^(?P<module>[\w.]+?)\.x[_ǁ]")
_RESULT = re.compile(r"^\s*(?P<mutant>\S+): (?P<status>.+)$")


def mutmut_config(modules: list[str], copied: set[str]) -> str:
    """The [tool.mutmut] section for these modules: each mutant meets only the tests selected
    here that reach its function, in one process (no xdist). `copied`: the copy's top-level
    files and folders."""
    tests = sorted({test for module in modules for test in MODULES[module]})
    packages = sorted({module.split("/", 1)[0] for module in modules})
    config = {
        "source_paths": packages,
        "only_mutate": modules,
        # Tests read files of the project (examples, configs, the stacks' assets) by path.
        "also_copy": sorted(copied - {*packages, "tests"}),
        "pytest_add_cli_args": ["-n", "0", "-p", "no:cacheprovider", "-q"],
        "pytest_add_cli_args_test_selection": tests,
        # A mutant that makes the worker's threads wait is stopped after 3x its tests' time.
        "timeout_multiplier": 3.0,
        "timeout_constant": 2.0,
    }
    if OWN_PROCESS.intersection(modules):
        # Each mutant's tests then start CDK first (seconds), which their timings leave out.
        config |= {
            "process_isolation": "forkserver",
            "forkserver_warmup": "none",
            "timeout_constant": 60.0,
        }
    lines = ["", "[tool.mutmut]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in config.items()]
    return "\n".join(lines) + "\n"


def mutant_patterns(modules: list[str]) -> list[str]:
    """mutmut's names (fnmatch patterns) of the mutants to test in these modules: all of a
    module's, or those of its FUNCTIONS."""
    patterns = []
    for module in modules:
        dotted = module.removesuffix(".py").replace("/", ".")
        if module not in FUNCTIONS:
            patterns.append(f"{dotted}.*")
        for name in FUNCTIONS.get(module, ()):
            owner, _, function = name.rpartition(".")
            inner = f"xǁ{owner}ǁ{function}" if owner else f"x_{function}"
            patterns.append(f"{dotted}.{inner}__mutmut_*")
    return patterns


def prepare(modules: list[str]) -> None:
    """A fresh copy of the working tree (tracked files and new ones not ignored), with
    mutmut's settings in its pyproject.toml."""
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for name in filter(None, files):
        source = ROOT / name.decode()
        if source.is_file():
            target = WORK / name.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    with (WORK / "pyproject.toml").open("a") as pyproject:
        pyproject.write(mutmut_config(modules, {path.name for path in WORK.iterdir()}))


def module_of(mutant: str) -> str:
    """`domain.runs.x_run_id_for__mutmut_3` -> `domain/runs.py` (mutmut names a function
    `x_<name>`, a method `xǁ<class>ǁ<name>`, after its module)."""
    return _MUTANT.match(mutant)["module"].replace(".", "/") + ".py"


def tally(results: str, equivalents: dict[str, str], patterns: list[str]) -> dict[str, dict]:
    """Per module: counts by outcome, the score, and the survivors not known equivalent, over
    the mutants matching `patterns`."""
    modules: dict[str, dict] = {}
    for line in results.splitlines():
        found = _RESULT.match(line)
        if not found or not any(fnmatch(found["mutant"], pattern) for pattern in patterns):
            continue
        mutant, status = found["mutant"], found["status"].strip()
        entry = modules.setdefault(
            module_of(mutant), {"counts": Counter(), "survivors": [], "equivalent": []}
        )
        if status != "killed" and mutant in equivalents:
            entry["equivalent"].append(mutant)
            status = "equivalent"
        elif status in ("survived", "no tests"):
            entry["survivors"].append(mutant)
        entry["counts"][status] += 1
    for entry in modules.values():
        counts = entry["counts"]
        # "not checked": the run stopped before reaching it.
        total = sum(counts.values()) - counts["equivalent"] - counts["not checked"]
        caught = counts["killed"] + counts["timeout"]
        entry["score"] = round(caught / total, 3) if total else None
        entry["counts"] = dict(counts)
    return modules


MUTMUT = [sys.executable, "-m", "mutmut"]


def mutate(modules: list[str], equivalents: dict[str, str]) -> tuple[dict[str, dict], list[str]]:
    """One mutmut run over `modules` in a fresh copy: the tally, and the surviving mutants'
    diffs (read before the next run replaces the copy)."""
    prepare(modules)
    patterns = mutant_patterns(modules)
    run = subprocess.run(
        [*MUTMUT, "run", "--max-children", str(os.cpu_count() or 1), *patterns],
        cwd=WORK,
        stdout=subprocess.DEVNULL,
        # mutmut forks each mutant's tests from a process that has imported torch, whose OpenMP
        # thread pool does not survive a fork: the child hangs in its first parallel operation
        # and the mutant counts as a timeout, i.e. caught, untested (238 of logprobs.py's 257).
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    if run.returncode:
        raise SystemExit(f"mutmut run failed (exit {run.returncode}); its work is in {WORK}")
    results = subprocess.run(
        [*MUTMUT, "results", "--all", "true"], cwd=WORK, check=True, capture_output=True, text=True
    ).stdout
    tallied = tally(results, equivalents, patterns)
    diffs = [
        subprocess.run(
            [*MUTMUT, "show", mutant], cwd=WORK, capture_output=True, text=True
        ).stdout.strip()
        for _, entry in sorted(tallied.items())
        for mutant in entry["survivors"]
    ]
    return tallied, diffs


def record(tallied: dict[str, dict], seconds: float) -> None:
    """Merge one group's figures into bench/results/mutation.json, beside earlier runs'."""
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    figures = {
        module: {
            "counts": entry["counts"],
            "score": entry["score"],
            "survivors": entry["survivors"],
            "run": f"{os.cpu_count()} cores, {sys.platform}, {seconds:.0f} s with "
            f"{', '.join(sorted(tallied))}",
        }
        for module, entry in tallied.items()
    }
    RESULTS.write_text(
        json.dumps({**previous, **figures}, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    )


def main(argv: list[str]) -> int:
    modules = argv or list(MODULES)
    unknown = [module for module in modules if module not in MODULES]
    if unknown:
        print(f"unknown module {', '.join(unknown)}; choose from {', '.join(MODULES)}")
        return 2
    equivalents = tomllib.loads(EQUIVALENTS.read_text()) if EQUIVALENTS.exists() else {}
    started = time.monotonic()
    tallied: dict[str, dict] = {}
    diffs: list[str] = []
    shared = [module for module in modules if module not in OWN_PROCESS]
    for group in (shared, [module for module in modules if module in OWN_PROCESS]):
        if group:
            group_started = time.monotonic()
            group_tally, group_diffs = mutate(group, equivalents)
            # Written per group: a run stopped half-way keeps the groups it finished.
            record(group_tally, time.monotonic() - group_started)
            tallied.update(group_tally)
            diffs += group_diffs
    seconds = time.monotonic() - started
    print(f"{'module':44} {'mutants':>7} {'killed':>7} {'survived':>8} {'untested':>8} score")
    for module, entry in sorted(tallied.items()):
        counts = entry["counts"]
        print(
            f"{module:44} {sum(counts.values()):7} {counts.get('killed', 0):7} "
            f"{counts.get('survived', 0):8} {counts.get('no tests', 0):8} "
            f"{entry['score'] if entry['score'] is not None else '-'}"
        )
    for diff in diffs:
        print(f"\n{diff}")
    print(f"\n{seconds:.0f} s; figures in {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
