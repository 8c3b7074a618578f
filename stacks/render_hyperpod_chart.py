"""Renders AWS's HyperPod Helm chart for a deployment, on the deploying machine, at deploy time.

`cdk deploy` runs this while it publishes assets (a file asset with an `executable`,
stacks/components/hyperpod_dependencies.py), before any stack changes: synth and the tests stay
offline, and a chart that cannot serve the deployment stops the deploy before anything is paid
for. It fetches the pinned commit with git, the chart's dependencies with `helm dependency
update`, renders with `helm template` (the values of stacks/hyperpod_chart.py), checks the
rendering and prints the path of a JSON file: what the install function applies.

Needs `git` and `helm` (3.8 or newer, for the OCI dependency) on PATH. Renderings are kept in
.cache/hyperpod-chart/, one per input.

    python -m stacks.render_hyperpod_chart <ChartRequest.encode()>
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import boto3
import yaml

from domain.kubernetes_kinds import KINDS
from stacks.hyperpod_chart import (
    CHART_PATH,
    COMMIT,
    NAMESPACE,
    RELEASE,
    REPOSITORY,
    ChartRequest,
    admit_restricted_nodes,
    check_rendering,
)

CACHE = Path(__file__).resolve().parents[1] / ".cache" / "hyperpod-chart"
# (argv, working directory) -> stdout; raises RenderFailed with the tool's message.
Run = Callable[[Sequence[str], Path], str]


class RenderFailed(RuntimeError):
    pass


def run_tool(argv: Sequence[str], cwd: Path) -> str:
    if shutil.which(argv[0]) is None:
        raise RenderFailed(
            f"`{argv[0]}` is not installed: deploying installs AWS's HyperPod Helm chart, which "
            f"is rendered here first; install {argv[0]} (helm 3.8+ from https://helm.sh) and "
            "deploy again"
        )
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RenderFailed(f"`{' '.join(argv)}` failed:\n{done.stderr.strip()}")
    return done.stdout


def default_region() -> str | None:
    """The region `cdk deploy` deploys an environment-agnostic stack to: the AWS CLI's."""
    return boto3.session.Session().region_name


def render(
    request: ChartRequest,
    *,
    cache: Path | None = None,
    run: Run | None = None,
    region_of_machine: Callable[[], str | None] = default_region,
) -> Path:
    """The JSON file of the rendered, checked objects for `request` (rendered once per input
    under `cache`, default CACHE), made with `run` (default: the real git and helm)."""
    cache, run = cache or CACHE, run or run_tool
    region = request.region or region_of_machine()
    if not region:
        raise RenderFailed(
            "no region to render the HyperPod Helm chart for: set `region` in cdk.json or "
            "AWS_REGION, as for `cdk deploy`"
        )
    values = request.values(region)
    # Every input, the instance types among them: a cached rendering was checked for them.
    key = hashlib.sha256(json.dumps([COMMIT, request.encode(), region]).encode()).hexdigest()[:16]
    output = cache / key / "objects.json"
    if output.exists():
        return output
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        run(["git", "init", "--quiet", "source"], work)
        source = work / "source"
        run(["git", "fetch", "--quiet", "--depth", "1", REPOSITORY, COMMIT], source)
        run(["git", "checkout", "--quiet", COMMIT], source)
        chart = source / CHART_PATH
        run(["helm", "dependency", "update", str(chart)], work)
        values_file = work / "values.json"
        values_file.write_text(json.dumps(values))
        manifest = run(
            [
                "helm", "template", RELEASE, str(chart),
                # `helm install` installs the charts' crds/ (Kubeflow's job kinds); `template`
                # prints them only when asked.
                "--include-crds",
                "--namespace", NAMESPACE,
                "--kube-version", request.kube_version,
                "--values", str(values_file),
            ],
            work,
        )  # fmt: skip
    objects = [_in_release_namespace(doc) for doc in yaml.safe_load_all(manifest) if doc]
    if request.restricted_instance_types:
        objects = admit_restricted_nodes(objects, region=region)
    check_rendering(objects, request)
    output.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "commit": COMMIT, "release": RELEASE, "region": region, "objects": objects,
        # The installer adds the EKS add-ons' copies for restricted nodes (lambdas/kubernetes/
        # rig_addons.py): they are made from the cluster's live add-ons, not rendered here.
        "restricted": bool(request.restricted_instance_types),
    }  # fmt: skip
    partial = output.with_suffix(".partial")
    partial.write_text(json.dumps(document, sort_keys=True))
    partial.replace(output)
    return output


def _in_release_namespace(obj: dict[str, Any]) -> dict[str, Any]:
    """`helm install` puts a namespaced object that names no namespace in the release's;
    `helm template` leaves it out, so it is written in here."""
    kind = KINDS.get((obj.get("apiVersion"), obj.get("kind")))
    metadata = obj.get("metadata") or {}
    if kind is not None and kind.namespaced and not metadata.get("namespace"):
        return {**obj, "metadata": {**metadata, "namespace": NAMESPACE}}
    return obj


def main(argv: Sequence[str]) -> int:
    try:
        request = ChartRequest.decode(argv[0])
        print(render(request))
    except (RenderFailed, ValueError, yaml.YAMLError) as error:  # RenderingError too
        print(f"HyperPod Helm chart: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
