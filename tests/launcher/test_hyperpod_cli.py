"""The launcher at its process boundary: the exact commands AWS's HyperPod CLI and helm are
given, the recipe the CLI reads, and what happens on a retry, a failed install and a stop."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from domain.nova_job import evaluation_image, evaluation_run_recipe, images, run_name
from lambdas.launcher.handler import REQUEST, LaunchRefused, StopJob, compose
from lambdas.launcher.hyperpod_cli import COMMAND_SECONDS, HyperPodCli, LaunchFailed, run_process
from tests.launcher.fake_cli import FakeLauncherProcesses

RECIPE = "fine-tuning/nova/forge/nova_2_0/nova_lite/RFT/nova-mtrl-wordle-0123456789"
BODY = {"run": {"name": "nova-mtrl-wordle-0123456789", "replicas": 2}, "training_config": {}}
IMAGE = "708977205387.dkr.ecr.us-east-1.amazonaws.com/nova-fine-tune-repo:SM-HP-RFT-TRAIN-V2-latest"


@pytest.fixture
def processes(tmp_path: Path) -> FakeLauncherProcesses:
    return FakeLauncherProcesses(tmp_path / "recipes")


CLUSTER = {"ClusterArn": "arn:aws:sagemaker:us-east-1:123456789012:cluster/0a1b2c3d4e5f",
           "ClusterName": "nova-mtrl"}  # fmt: skip


@pytest.fixture
def cli(processes: FakeLauncherProcesses, tmp_path: Path) -> HyperPodCli:
    """As the handler runs it: the cluster context stored (lambdas/launcher/handler.py)."""
    context = tmp_path / "hyperpod_current_context.json"
    context.write_text(json.dumps(CLUSTER))
    return HyperPodCli(
        recipes=processes.recipes, workdir=tmp_path / "work/launcher",
        environment={"KUBECONFIG": "/k", "HOME": "/h", "HYPERPOD_CONTEXT_FILE": str(context)},
        run=processes,
    )  # fmt: skip


def start(cli: HyperPodCli, body: dict = BODY) -> str:
    return cli.start(
        name=body["run"]["name"], recipe=RECIPE, body=body, instance_type="ml.p5.48xlarge",
        container=IMAGE,
    )  # fmt: skip


def test_start_writes_the_recipe_and_runs_start_job_as_the_sdk_does(
    cli: HyperPodCli, processes: FakeLauncherProcesses, tmp_path: Path
) -> None:
    job = start(cli)
    assert re.fullmatch(r"nova-mtrl-wordle-0123456789-[a-z0-9]{5}", job)
    listed, started = processes.calls
    assert listed.argv == [
        "helm", "list", "--namespace", "kubeflow", "--all", "--filter",
        r"^nova\-mtrl\-wordle\-0123456789-[a-z0-9]{5}$", "--output", "json",
    ]  # fmt: skip
    assert started.argv == [
        "hyperpod", "start-job", "--namespace", "kubeflow", "--recipe", RECIPE,
        "--override-parameters",
        json.dumps({"instance_type": "ml.p5.48xlarge", "container": IMAGE}),
    ]  # fmt: skip
    assert processes.recipes_read == [BODY]  # read from the collection, as written
    assert (started.env["KUBECONFIG"], started.env["HOME"]) == ("/k", "/h")
    # The launcher's results/ go to the working directory (made), not /var/task.
    assert started.cwd == tmp_path / "work/launcher" and started.cwd.is_dir()
    assert {call.timeout for call in processes.calls} == {COMMAND_SECONDS}
    assert processes.releases == {job: "deployed"}


def test_a_retried_start_finds_the_deployed_job_and_starts_nothing(
    cli: HyperPodCli, processes: FakeLauncherProcesses
) -> None:
    first = start(cli)
    assert start(cli) == first
    assert len(processes.started()) == 1


def test_an_install_that_failed_is_uninstalled_before_starting_again(
    cli: HyperPodCli, processes: FakeLauncherProcesses
) -> None:
    """The CLI exits 0 when helm install fails (the launcher does not check it): no NAME line,
    so the start fails with what was said; the next attempt clears the failed release."""
    processes.install_fails = True
    with pytest.raises(LaunchFailed, match="started no job for nova-mtrl-wordle-0123456789: "
                       "Error: INSTALLATION FAILED: context deadline exceeded"):  # fmt: skip
        start(cli)
    (failed,) = processes.releases
    processes.install_fails = False
    job = start(cli)
    assert processes.releases == {job: "deployed"} and job != failed
    assert ["helm", "uninstall", failed, "--namespace", "kubeflow"] in [
        call.argv for call in processes.calls
    ]


def test_a_start_job_that_exits_non_zero_fails_with_its_output(
    cli: HyperPodCli, processes: FakeLauncherProcesses
) -> None:
    def refusing(argv, **kwargs):  # type: ignore[no-untyped-def]
        done = processes(argv, **kwargs)
        if argv[:2] == ["hyperpod", "start-job"]:
            done.returncode, done.stderr = 1, "Cannot start Training job due to AWS credentials"
        return done

    cli._run = refusing
    with pytest.raises(LaunchFailed) as failed:
        start(cli)
    # What it said on both streams, stderr first.
    assert str(failed.value).startswith(
        "hyperpod start-job exited 1: Cannot start Training job due to AWS credentials\n"
        "Final command: python3 main.py recipes=" + RECIPE + "\n"
    )


def test_a_command_that_fails_silently_says_so(cli: HyperPodCli) -> None:
    cli._run = lambda argv, **_: subprocess.CompletedProcess(argv, 2, "", "")
    with pytest.raises(LaunchFailed, match="^helm list exited 2: no output$"):
        cli.stop("n")


def test_stop_uninstalls_the_runs_releases_and_no_one_elses(
    cli: HyperPodCli, processes: FakeLauncherProcesses
) -> None:
    """A run whose name starts with another's (`…-a` and `…-a-2`) keeps its job."""
    mine = start(cli)
    other_body = {"run": {"name": f"{BODY['run']['name']}-2", "replicas": 2}}
    other = start(cli, other_body)
    assert cli.stop(BODY["run"]["name"]) == 1
    assert processes.releases == {other: "deployed"} and mine not in processes.releases
    assert cli.stop(BODY["run"]["name"]) == 0  # idempotent


def test_a_release_gone_meanwhile_is_not_an_error_and_other_uninstall_failures_are(
    cli: HyperPodCli, processes: FakeLauncherProcesses
) -> None:
    job = start(cli)
    del processes.releases[job]
    cli._uninstall(job)  # "release: not found": what was asked for is true
    processes.releases["x"] = "deployed"
    broken = FakeLauncherProcesses(processes.recipes)

    def forbidden(argv, **kwargs):  # type: ignore[no-untyped-def]
        done = broken(argv, **kwargs)
        if argv[:2] == ["helm", "uninstall"]:
            done.returncode, done.stderr = 1, "Error: secrets is forbidden: User cannot delete"
        return done

    cli._run = forbidden
    with pytest.raises(LaunchFailed, match="helm uninstall x failed: Error: secrets is forbidden"):
        cli._uninstall("x")


def test_a_run_name_is_a_dns_label_the_launcher_keeps_whole() -> None:
    """The launcher keeps 34 characters of run.name; a longer run id is shortened with a hash
    so two runs never share a name; the chart's longest object name stays within 63."""
    short = run_name("nova-mtrl", "wordle-0123456789")
    assert short == "nova-mtrl-wordle-0123456789"
    long_a = run_name("nova-mtrl", "a-very-long-dataset-name-for-wordle-0123456789")
    long_b = run_name("nova-mtrl", "a-very-long-dataset-name-for-wordle-9876543210")
    assert len(long_a) == len(long_b) == 34 and long_a != long_b
    # Its first 23 characters, then 10 of the whole name's SHA-256 (the first value, pinned).
    assert long_a == "nova-mtrl-a-very-long-d-1e80d40a9a"
    # A cut that ends on a dash does not make two in a row.
    assert run_name("nova-mtrl", "abcdefghijkl-" + "y" * 30) == "nova-mtrl-abcdefghijkl-3f907bbf44"
    # 34 characters stay whole; 35 do not.
    assert run_name("p", "x" * 32) == "p-" + "x" * 32
    assert run_name("p", "x" * 33) == "p-xxxxxxxxxxxxxxxxxxxxx-74666a8105"
    assert run_name("Team_7", "9x") == "team-7-9x" and run_name("-p", "x") == "p-x"
    assert run_name("7", "x") == "r-7-x" and run_name("a7", "x") == "a7-x"  # starts with a letter
    assert len(f"{long_a}-abcde-nats-server-bootstrap") <= 63  # the chart's longest Job name
    assert yaml.safe_load(f"n: {long_a}")["n"] == long_a  # stays a plain string in YAML


def test_the_launcher_function_takes_its_two_requests_and_nothing_else() -> None:
    assert REQUEST.validate_python({"action": "stop", "name": "n"}) == StopJob(
        action="stop", name="n"
    )
    for wrong in (
        {"action": "restart", "name": "n"},
        {"action": "stop", "name": "n", "force": True},
        {"action": "start", "name": "n", "recipe": "r", "body": {}, "instance_type": "t"},
    ):
        with pytest.raises(ValidationError):
            REQUEST.validate_python(wrong)


def test_a_program_runs_in_its_directory_with_its_environment_and_its_exit_status_is_kept(
    tmp_path: Path,
) -> None:
    """The process boundary itself: a real program, whatever its exit status."""
    program = [sys.executable, "-c", "import os, sys; print(os.getcwd(), os.environ['MARK']); "
               "print('said', file=sys.stderr); sys.exit(3)"]  # fmt: skip
    done = run_process(
        program, env={"MARK": "m", "PATH": os.environ["PATH"]}, cwd=tmp_path, timeout=30
    )
    assert (done.returncode, done.stdout.split(), done.stderr) == (
        3,
        [str(tmp_path), "m"],
        "said\n",
    )
    with pytest.raises(subprocess.TimeoutExpired):
        run_process([sys.executable, "-c", "import time; time.sleep(5)"], env={}, cwd=tmp_path,
                    timeout=0.2)  # fmt: skip


def test_without_the_cluster_context_the_cli_fails_after_installing_and_a_retry_reuses_the_job(
    cli: HyperPodCli, processes: FakeLauncherProcesses, tmp_path: Path
) -> None:
    """AWS's CLI reads the context `hyperpod connect-cluster` stores once its job is installed
    (release_v2 commands/job.py start_job → get_cluster_console_url): without it the start
    fails with the CLI's words — and the job it installed is the one a retry finds."""
    (tmp_path / "hyperpod_current_context.json").unlink()
    with pytest.raises(LaunchFailed, match="hyperpod_current_context.json"):
        start(cli)
    (installed,) = processes.releases
    assert start(cli) == installed and len(processes.started()) == 1


def test_a_start_names_a_runs_own_recipe_and_a_nova_image_or_nothing_is_done(
    tmp_path: Path,
) -> None:
    """The launcher may create workloads in Nova's namespace: an invoker cannot choose another
    file to write, another image to run or a name that is not a run's."""
    environment = {"EKS_CLUSTER": "nova-mtrl-eks", "HYPERPOD_CLUSTER": "nova-mtrl",
                   "AWS_REGION": "us-east-1", "HYPERPOD_RECIPES": str(tmp_path / "recipes"),
                   "NEMO_LAUNCHER_SCRIPTS": str(tmp_path / "nemo")}  # fmt: skip
    called: list[str] = []

    def clients(service: str) -> None:
        called.append(service)
        raise AssertionError(f"a refused start reached {service}")

    launch = compose(environment, clients)["launch_job"]  # type: ignore[arg-type]
    name = BODY["run"]["name"]
    good = {"action": "start", "name": name, "recipe": RECIPE, "body": BODY,
            "instance_type": "ml.p5.48xlarge", "container": IMAGE}  # fmt: skip
    assert images("us-east-1")["training"] == IMAGE
    evaluation = {**good, "recipe": evaluation_run_recipe(name),
                  "container": evaluation_image("us-east-1")}  # fmt: skip
    for fine in (good, evaluation):
        with pytest.raises(AssertionError, match="reached sagemaker"):
            launch(fine)  # checked, then on to the cluster
    refused = {
        "recipe": [f"{RECIPE.rpartition('/')[0]}/other-run", "../../../tmp/x",
                   "fine-tuning/llama/llama3/run"],
        "container": ["attacker.example/miner:latest",
                      IMAGE.replace("us-east-1", "us-west-2"), IMAGE + "x"],
    }  # fmt: skip
    for field, values in refused.items():
        for value in values:
            with pytest.raises(LaunchRefused, match=f"^{field} "):
                launch({**good, field: value})
    for wrong in ({**good, "name": "../n"}, {**good, "instance_type": "ml.p5 && rm -rf"},
                  {"action": "stop", "name": "a; b"}):  # fmt: skip
        with pytest.raises(ValidationError):
            launch(wrong)
    assert called == ["sagemaker", "sagemaker"]
