"""`make mutate`'s bookkeeping (bench/mutate.py): which mutants belong to which module, the score
with equivalent mutants left out, and the mutmut settings each run gets."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import bench.mutate
from bench.mutate import (
    FUNCTIONS,
    MODULES,
    OWN_PROCESS,
    ROOT,
    module_of,
    mutant_patterns,
    mutmut_config,
    record,
    tally,
)

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
    tallied = tally(RESULTS, equivalent, ["domain.runs.*", "reward_envs.worker.worker.*"])
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


def test_only_the_mutants_asked_for_are_counted() -> None:
    tallied = tally(RESULTS, {}, ["domain.runs.x_run_id_for__mutmut_*"])
    assert list(tallied) == ["domain/runs.py"]
    assert tallied["domain/runs.py"]["counts"] == {"killed": 1, "survived": 1}


def test_a_module_with_chosen_functions_is_mutated_in_those_only() -> None:
    patterns = mutant_patterns(["domain/runs.py", "reward_envs/worker/worker.py"])
    assert patterns[0] == "domain.runs.*"
    assert len(patterns) == 1 + len(FUNCTIONS["reward_envs/worker/worker.py"])
    tallied = tally(RESULTS, {}, patterns)
    assert tallied["reward_envs/worker/worker.py"]["counts"] == {"timeout": 1, "survived": 1}
    other = "reward_envs.worker.worker.xǁ_Completerǁ_loop__mutmut_1: survived"
    assert "reward_envs/worker/worker.py" not in tally(other, {}, patterns)


def test_module_names_follow_mutmut_mutant_names() -> None:
    assert module_of("lambdas.pipeline.policies.x_reaping__mutmut_12") == (
        "lambdas/pipeline/policies.py"
    )
    assert module_of("local_trainer.grpo.xǁGrpoǁloss__mutmut_1") == ("local_trainer/grpo.py")
    assert module_of("lambdas.xray.x_trace__mutmut_2") == "lambdas/xray.py"


def test_each_run_mutates_only_the_modules_asked_for_with_their_tests() -> None:
    copied = {"domain", "tests", "examples", "pyproject.toml"}
    config = tomllib.loads(mutmut_config(["domain/dataset.py"], copied))["tool"]["mutmut"]
    assert config["only_mutate"] == ["domain/dataset.py"]
    assert config["source_paths"] == ["domain"]
    assert config["pytest_add_cli_args_test_selection"] == sorted(MODULES["domain/dataset.py"])
    assert config["also_copy"] == ["examples", "pyproject.toml"]  # tests read them by path
    assert config["pytest_add_cli_args"][:2] == ["-n", "0"]  # mutmut reads one process's trace
    assert "process_isolation" not in config  # forked from the process that ran the tests


def test_modules_whose_tests_start_jsii_get_a_fresh_process_per_mutant() -> None:
    (module,) = OWN_PROCESS
    config = tomllib.loads(mutmut_config([module], {"stacks", "tests"}))["tool"]["mutmut"]
    assert (config["process_isolation"], config["forkserver_warmup"]) == ("forkserver", "none")
    assert config["timeout_constant"] >= 30  # starting CDK is not a hang


def test_every_module_test_file_and_chosen_function_exists() -> None:
    for module, tests in MODULES.items():
        assert (ROOT / module).is_file(), module
        for test in tests:
            assert (Path(ROOT) / test).is_file(), test
    for module, functions in FUNCTIONS.items():
        assert module in MODULES
        source = (ROOT / module).read_text()
        for name in functions:
            owner, _, function = name.rpartition(".")
            assert f"class {owner}" in source and f"    def {function}(" in source, name


def test_each_group_figures_join_the_earlier_runs_figures(tmp_path, monkeypatch) -> None:
    results = tmp_path / "mutation.json"
    results.write_text(json.dumps({"domain/runs.py": {"score": 1.0}}))
    monkeypatch.setattr(bench.mutate, "RESULTS", results)
    tallied = tally(RESULTS, {}, ["reward_envs.worker.worker.*"])
    record(tallied, 61.4)
    written = json.loads(results.read_text())
    assert written["domain/runs.py"] == {"score": 1.0}
    worker = written["reward_envs/worker/worker.py"]
    assert worker["counts"] == {"timeout": 1, "survived": 1}
    assert worker["survivors"] == ["reward_envs.worker.worker.xǁRewardWorkerǁ_heartbeat__mutmut_10"]
    assert "61 s" in worker["run"]
