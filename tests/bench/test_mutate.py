"""`make mutate`'s bookkeeping (bench/mutate.py): which mutants belong to which module, the score
with equivalent mutants left out, and the mutmut settings each run gets."""

from __future__ import annotations

import tomllib
from pathlib import Path

from bench.mutate import MODULES, ROOT, module_of, mutmut_config, tally

RESULTS = """\
    domain.runs.x_run_id_for__mutmut_1: killed
    domain.runs.x_run_id_for__mutmut_2: survived
    domain.runs.xǁRunStoreǁall__mutmut_3: no tests
    domain.runs.xǁRunStoreǁget__mutmut_4: killed
    reward_envs.worker.worker.xǁRewardWorkerǁ_heartbeat__mutmut_9: timeout
    reward_envs.worker.worker.xǁRewardWorkerǁ_heartbeat__mutmut_10: survived
"""


def test_mutants_are_counted_per_module_and_equivalents_leave_the_score() -> None:
    equivalent = {"reward_envs.worker.worker.xǁRewardWorkerǁ_heartbeat__mutmut_10": "same delay"}
    tallied = tally(RESULTS, equivalent)
    runs, worker = tallied["domain/runs.py"], tallied["reward_envs/worker/worker.py"]
    assert runs["counts"] == {"killed": 2, "survived": 1, "no tests": 1}
    assert runs["score"] == 0.5
    assert runs["survivors"] == [
        "domain.runs.x_run_id_for__mutmut_2",
        "domain.runs.xǁRunStoreǁall__mutmut_3",
    ]
    # A mutant that hangs its tests is caught; the equivalent one leaves the denominator.
    assert worker["counts"] == {"timeout": 1, "equivalent": 1}
    assert worker["score"] == 1.0 and worker["survivors"] == []


def test_module_names_follow_mutmut_mutant_names() -> None:
    assert module_of("lambdas.pipeline.policies.x_reaping__mutmut_12") == (
        "lambdas/pipeline/policies.py"
    )
    assert module_of("mtrl.local.trainer.grpo.xǁGrpoǁloss__mutmut_1") == (
        "mtrl/local/trainer/grpo.py"
    )
    assert module_of("lambdas.xray.x_trace__mutmut_2") == "lambdas/xray.py"


def test_each_run_mutates_only_the_modules_asked_for_with_their_tests() -> None:
    copied = {"domain", "tests", "examples", "pyproject.toml"}
    config = tomllib.loads(mutmut_config(["domain/dataset.py"], copied))["tool"]["mutmut"]
    assert config["only_mutate"] == ["domain/dataset.py"]
    assert config["source_paths"] == ["domain"]
    assert config["pytest_add_cli_args_test_selection"] == sorted(MODULES["domain/dataset.py"])
    assert config["also_copy"] == ["examples", "pyproject.toml"]  # tests read them by path
    assert config["pytest_add_cli_args"][:2] == ["-n", "0"]  # mutmut reads one process's trace


def test_every_module_and_test_file_exists() -> None:
    for module, tests in MODULES.items():
        assert (ROOT / module).is_file(), module
        for test in tests:
            assert (Path(ROOT) / test).is_file(), test
