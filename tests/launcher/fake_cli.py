"""AWS's HyperPod CLI and helm at their process boundary, for the launcher's tests.

`hyperpod start-job` reads the recipe it is pointed at from the recipes collection (as AWS's
launcher does) and installs a release named as the launcher names it: the recipe's `run.name`
cut to 34 characters, `-`, 5 random letters or digits (aws/sagemaker-hyperpod-recipes main.py,
`valid_run_name`); its output ends with `helm install`'s (`NAME: ...`). `helm list --filter`
and `helm uninstall` see and remove releases as helm does (helm.sh/docs/helm/helm_list: a
Perl-compatible regular expression over release names). Once its job is installed,
`start-job` reads the cluster context `hyperpod connect-cluster` stores and fails without it
(release_v2 commands/job.py `start_job` → utils.py `get_cluster_console_url`): the real CLI
reads /tmp/hyperpod_current_context.json; this one reads what the process's
HYPERPOD_CONTEXT_FILE names (the handler's setting, passed down), so tests keep it in their
own folder. Every call is recorded."""

from __future__ import annotations

import datetime
import json
import random
import re
import string
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import yaml

from lambdas.clients import Clients
from lambdas.launcher.handler import compose
from tests.service_fakes import ServiceFake

PYTORCH_JOBS = "/apis/kubeflow.org/v1/namespaces/kubeflow/pytorchjobs"
PODS = "/api/v1/namespaces/kubeflow/pods"
CONTEXT_FILE = "/tmp/hyperpod_current_context.json"  # the real CLI's, never used by the tests


@dataclass(frozen=True)
class Call:
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    timeout: float


class FakeLauncherProcesses:
    def __init__(self, recipes: Path, *, seed: int = 7, kubernetes: Any = None) -> None:
        """With `kubernetes` (a FakeKubernetes), an install puts the chart's PyTorchJob in
        `kubeflow` and an uninstall removes it and the job's pods, as helm would."""
        self.recipes, self.kubernetes = recipes, kubernetes
        self.releases: dict[str, str] = {}  # name -> helm status
        self.calls: list[Call] = []
        self.recipes_read: list[dict[str, Any]] = []
        self.install_fails = False  # helm install fails; the CLI still exits 0
        self._random = random.Random(seed)

    def started(self) -> list[Call]:
        return [call for call in self.calls if call.argv[:2] == ["hyperpod", "start-job"]]

    def __call__(
        self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        argv = list(argv)
        self.calls.append(Call(argv, dict(env), cwd, timeout))
        match argv[:2]:
            case ["hyperpod", "start-job"]:
                return self._start(argv, Path(env.get("HYPERPOD_CONTEXT_FILE", CONTEXT_FILE)))
            case ["helm", "list"]:
                pattern = re.compile(argv[argv.index("--filter") + 1])
                listed = [
                    {"name": name, "namespace": "kubeflow", "revision": "1", "status": status,
                     "chart": "nova-rft-0.1.0", "app_version": "1.0"}
                    for name, status in sorted(self.releases.items()) if pattern.search(name)
                ]  # fmt: skip
                return _done(argv, 0, json.dumps(listed))
            case ["helm", "uninstall"]:
                name = argv[2]
                if self.releases.pop(name, None) is None:
                    error = f"Error: uninstall: Release not loaded: {name}: release: not found"
                    return _done(argv, 1, "", error)
                if self.kubernetes is not None:
                    self.kubernetes.objects.get(PYTORCH_JOBS, {}).pop(name, None)
                    pods = self.kubernetes.objects.get(PODS, {})
                    for pod in [pod for pod in pods if pod.startswith(f"{name}-")]:
                        del pods[pod]
                return _done(argv, 0, f'release "{name}" uninstalled\n')
        return _done(argv, 127, "", f"{argv[0]}: command not found")

    def _start(self, argv: list[str], context: Path) -> subprocess.CompletedProcess[str]:
        path = self.recipes / f"{argv[argv.index('--recipe') + 1]}.yaml"
        if not path.exists():
            return _done(argv, 1, "", f"Could not find recipes/{path.name}")
        recipe = yaml.safe_load(path.read_text(encoding="utf-8"))
        self.recipes_read.append(recipe)
        suffix = "".join(self._random.choices(string.ascii_lowercase + string.digits, k=5))
        name = f"{recipe['run']['name'][:34]}-{suffix}"
        final = f"Final command: python3 main.py recipes={argv[argv.index('--recipe') + 1]}\n"
        if self.install_fails:
            self.releases[name] = "failed"
            return _done(argv, 0, final, "Error: INSTALLATION FAILED: context deadline exceeded")
        self.releases[name] = "deployed"
        if self.kubernetes is not None:
            self.kubernetes.objects.setdefault(PYTORCH_JOBS, {})[name] = {
                "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                "metadata": {"name": name, "namespace": "kubeflow",
                             "creationTimestamp": datetime.datetime.now(datetime.UTC).strftime(
                                 "%Y-%m-%dT%H:%M:%SZ")},
                "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1}}},
            }  # fmt: skip
        installed = (
            f"NAME: {name}\nLAST DEPLOYED: Wed Dec  2 15:00:00 2026\nNAMESPACE: kubeflow\n"
            "STATUS: deployed\nREVISION: 1\nTEST SUITE: None\n"
        )
        if not context.exists():
            missing = f"FileNotFoundError: [Errno 2] No such file or directory: '{context}'"
            return _done(
                argv, 1, final + installed, f"Traceback (most recent call last):\n{missing}"
            )
        cluster = json.loads(context.read_text(encoding="utf-8"))
        region = cluster["ClusterArn"].split(":")[3]
        console = (f"https://{region}.console.aws.amazon.com/sagemaker/home?region={region}"
                   f"#/cluster-management/{cluster['ClusterName']}")  # fmt: skip
        return _done(argv, 0, final + installed + json.dumps({"Console URL": console}, indent=1))


def _done(
    argv: list[str], code: int, stdout: str, stderr: str = ""
) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(argv, code, stdout, stderr)


class InProcessLauncher(ServiceFake):
    """The launcher function behind Lambda's Invoke, run in-process (moto runs no Lambda code)
    with `processes` as its HyperPod CLI and helm; an exception is a function error, as Lambda
    reports one (`FunctionError: Unhandled`, the error's message and type in the payload)."""

    service = "lambda"

    def __init__(self, processes: FakeLauncherProcesses, *, function: str, environment: dict[str, str]) -> None:  # fmt: skip
        super().__init__()
        self.function = function
        self.handler = compose(environment, Clients(boto3.Session()), run=processes)["launch_job"]

    @property
    def payloads(self) -> list[dict[str, Any]]:
        return [json.loads(params["Payload"]) for params in self.operations("Invoke")]

    def invoke(self, **request: Any) -> dict[str, Any]:
        assert request["FunctionName"] == self.function
        assert request["InvocationType"] == "RequestResponse"
        try:
            result = self.handler(json.loads(request["Payload"]))
        except Exception as error:  # noqa: BLE001 - Lambda reports any error the same way
            failure = {"errorMessage": str(error), "errorType": type(error).__name__}
            return {"StatusCode": 200, "FunctionError": "Unhandled",
                    "Payload": json.dumps(failure).encode()}  # fmt: skip
        return {"StatusCode": 200, "Payload": json.dumps(result).encode()}
