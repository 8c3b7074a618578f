"""AWS's launcher for a Nova job, driven at its process boundary: the HyperPod CLI
(`hyperpod start-job`, which runs aws/sagemaker-hyperpod-recipes' launcher and so `helm install`
of AWS's chart) and `helm` for what the CLI has no command for.

- start: the run's recipe is written where the CLI's recipes collection has it under `--recipe`
  (the image links the Forge folder of that collection to a writable one), then
  `hyperpod start-job` as the Nova Forge SDK runs it (`SMHPRuntimeManager.execute`); the job's
  name is the `NAME:` line of its output (the launcher appends a random suffix to the recipe's
  `run.name`, so it cannot be known before);
- idempotent: a release of the run found already deployed is the job (nothing is started
  twice); one left failed or half-installed by an earlier attempt is uninstalled first;
- stop: `helm uninstall` of every release of the run — which removes everything the chart made.
  The CLI's `cancel-job` deletes the PyTorchJob first and skips the uninstall when that is gone
  (aws/sagemaker-hyperpod-cli release_v2, `service/cancel_training_job.py`), which would leave
  the rest behind after a job that failed half-installed.

The CLI can exit 0 having started nothing (its launcher does not check `helm install`'s exit
status), so a start without a `NAME:` line fails with what the CLI said.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from domain.nova_job import NAMESPACE, job_pattern, launcher_command

JOB_NAME = re.compile(r"^NAME: (\S+)$", re.MULTILINE)  # `helm install`'s first line
COMMAND_SECONDS = 600.0  # `helm install` without --wait takes seconds; the chart's timeout is 15m
OUTPUT_TAIL = 2000  # of a failed command's output, in its error


class Runner(Protocol):
    """Runs a program and returns how it ended (subprocess.run's answer)."""

    def __call__(
        self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, timeout: float
    ) -> subprocess.CompletedProcess[str]: ...


def run_process(
    argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), env=dict(env), cwd=cwd, timeout=timeout, capture_output=True, text=True,
    )  # fmt: skip


class LaunchFailed(RuntimeError):
    """A command of the launcher failed; the message has the command and what it said."""


@dataclass(frozen=True)
class Release:
    name: str
    status: str  # helm's: deployed, failed, pending-install, uninstalling, ...


class HyperPodCli:
    def __init__(
        self,
        *,
        recipes: Path,
        workdir: Path,
        environment: Mapping[str, str],
        run: Runner = run_process,
    ) -> None:
        """`recipes`: the CLI's recipes collection (`--recipe` paths are relative to it);
        `workdir`: where the launcher writes its results; `environment`: the commands' (with
        KUBECONFIG and a writable HOME)."""
        self.recipes, self.workdir = recipes, workdir
        self.environment = dict(environment)
        self._run = run

    def start(self, *, name: str, recipe: str, body: dict[str, Any], instance_type: str, container: str) -> str:  # fmt: skip
        """Start run `name`'s job from `body` written as recipe `recipe`; its job's name."""
        for release in self.releases(name):
            if release.status == "deployed":
                return release.name
            self._uninstall(release.name)
        path = self.recipes / f"{recipe}.yaml"
        # Through the image's link to /tmp, which a new execution environment has not made yet.
        Path(os.path.realpath(path.parent)).mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(body))  # ASCII: safe_dump escapes the rest
        done = self._call(
            launcher_command(recipe=recipe, instance_type=instance_type, container=container)
        )
        found = JOB_NAME.search(done.stdout)
        if found is None or not re.match(job_pattern(name), found.group(1)):
            raise LaunchFailed(f"hyperpod start-job started no job for {name}: {_said(done)}")
        return found.group(1)

    def stop(self, name: str) -> int:
        """Uninstall every release of run `name`; how many there were."""
        releases = self.releases(name)
        for release in releases:
            self._uninstall(release.name)
        return len(releases)

    def releases(self, name: str) -> list[Release]:
        """The run's releases in any state (helm's --all), by the launcher's naming."""
        done = self._call(
            ["helm", "list", "--namespace", NAMESPACE, "--all", "--filter", job_pattern(name),
             "--output", "json"]
        )  # fmt: skip
        listed = json.loads(done.stdout)  # `[]` when there is none
        return [Release(item["name"], item["status"]) for item in listed]

    def _uninstall(self, release: str) -> None:
        done = self._call(["helm", "uninstall", release, "--namespace", NAMESPACE], check=False)
        # Gone meanwhile (another attempt took it): what was asked for is true.
        if done.returncode != 0 and "not found" not in done.stderr:
            raise LaunchFailed(f"helm uninstall {release} failed: {_said(done)}")

    def _call(self, argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        self.workdir.mkdir(parents=True, exist_ok=True)
        done = self._run(argv, env=self.environment, cwd=self.workdir, timeout=COMMAND_SECONDS)
        if check and done.returncode != 0:
            raise LaunchFailed(f"{' '.join(argv[:2])} exited {done.returncode}: {_said(done)}")
        return done


def _said(done: subprocess.CompletedProcess[str]) -> str:
    said = "\n".join(part.strip() for part in (done.stderr, done.stdout) if part.strip())
    return said[-OUTPUT_TAIL:] or "no output"
