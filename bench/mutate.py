"""Mutation testing of the modules where a silent bug costs money or data (`make mutate`).

mutmut plants small bugs (mutants) in each module below, one at a time, and runs the tests that
reach the mutated function; a mutant no test notices survives. This runs mutmut in a copy of
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "build" / "mutate"
EQUIVALENTS = ROOT / "bench" / "mutation_equivalents.toml"
RESULTS = ROOT / "bench" / "results" / "mutation.json"

# Module -> the test files that exercise it (the fast ones: unit tests and moto, no synth).
MODULES: dict[str, tuple[str, ...]] = {
    "domain/runs.py": (
        "tests/pipeline/test_pipeline_steps.py",
        "tests/pipeline/test_handlers.py",
        "tests/pipeline/test_policies.py",
        "tests/mtrl/test_ops_commands.py",
    ),
    "domain/dataset.py": ("tests/mtrl/test_dataset.py", "tests/pipeline/test_pipeline_steps.py"),
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
    "lambdas/router/proxy.py": ("tests/router/test_proxy.py",),
    "reward_envs/worker/worker.py": ("tests/reward_envs/test_worker.py",),
    "mtrl/local/trainer/grpo.py": ("tests/local/test_trainer.py",),
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
    lines = ["", "[tool.mutmut]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in config.items()]
    return "\n".join(lines) + "\n"


def prepare(modules: list[str]) -> None:
    """A fresh copy of the tracked files, with mutmut's settings in its pyproject.toml."""
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True
    ).stdout.split(b"\0")
    for name in filter(None, tracked):
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


def tally(results: str, equivalents: dict[str, str]) -> dict[str, dict]:
    """Per module: counts by outcome, the score, and the survivors not known equivalent."""
    modules: dict[str, dict] = {}
    for line in results.splitlines():
        found = _RESULT.match(line)
        if not found:
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


def main(argv: list[str]) -> int:
    modules = argv or list(MODULES)
    unknown = [module for module in modules if module not in MODULES]
    if unknown:
        print(f"unknown module {', '.join(unknown)}; choose from {', '.join(MODULES)}")
        return 2
    equivalents = tomllib.loads(EQUIVALENTS.read_text()) if EQUIVALENTS.exists() else {}
    prepare(modules)
    mutmut = [sys.executable, "-m", "mutmut"]
    started = time.monotonic()
    subprocess.run(
        [*mutmut, "run", "--max-children", str(os.cpu_count() or 1)],
        cwd=WORK,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    seconds = time.monotonic() - started
    results = subprocess.run(
        [*mutmut, "results", "--all", "true"], cwd=WORK, check=True, capture_output=True, text=True
    ).stdout
    tallied = tally(results, equivalents)
    print(f"{'module':44} {'mutants':>7} {'killed':>7} {'survived':>8} {'untested':>8} score")
    for module, entry in sorted(tallied.items()):
        counts = entry["counts"]
        print(
            f"{module:44} {sum(counts.values()):7} {counts.get('killed', 0):7} "
            f"{counts.get('survived', 0):8} {counts.get('no tests', 0):8} "
            f"{entry['score'] if entry['score'] is not None else '-'}"
        )
    for _, entry in sorted(tallied.items()):
        for mutant in entry["survivors"]:
            shown = subprocess.run(
                [*mutmut, "show", mutant], cwd=WORK, capture_output=True, text=True
            ).stdout
            print(f"\n{shown.strip()}")
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                **previous,
                **{
                    module: {
                        "counts": entry["counts"],
                        "score": entry["score"],
                        "survivors": entry["survivors"],
                    }
                    for module, entry in tallied.items()
                },
                "_machine": f"{os.cpu_count()} cores, {sys.platform}, mutmut run {seconds:.0f} s",
            },
            indent=2,
            sort_keys=True,
            ensure_ascii=False,
        )
        + "\n"
    )
    print(f"\n{seconds:.0f} s; figures in {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
