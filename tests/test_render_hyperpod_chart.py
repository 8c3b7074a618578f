"""The deploy-time rendering of AWS's HyperPod Helm chart (stacks/render_hyperpod_chart.py): the
commands it runs (git at the pinned commit, helm with our values), what it hands to the
installer, and the errors that stop a deploy before anything is created. git and helm are
faked behind the program's own `run`: the tests assert what is sent to them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from stacks import render_hyperpod_chart as renderer
from stacks.hyperpod_chart import CHART_PATH, COMMIT, NAMESPACE, RELEASE, REPOSITORY, ChartRequest
from tests.chart_rendering import manifest, rendering

REQUEST = ChartRequest(
    kube_version="1.33", region=None, instance_types=("ml.p5.48xlarge",),
    kubeflow_training_operator=False,
)  # fmt: skip


class Tools:
    """git and helm as the renderer calls them: the commands, in order; `helm template` prints
    `output`, and the values file it was given is kept."""

    def __init__(self, output: str) -> None:
        self.output = output
        self.commands: list[list[str]] = []
        self.values: dict | None = None

    def __call__(self, argv: Sequence[str], cwd: Path) -> str:
        self.commands.append(list(argv))
        if argv[:2] == ["helm", "template"]:
            self.values = json.loads(Path(argv[argv.index("--values") + 1]).read_text())
            return self.output
        return ""


def test_renders_the_pinned_commit_with_our_values_and_hands_over_checked_objects(
    tmp_path: Path,
) -> None:
    tools = Tools(manifest(rendering()))
    path = renderer.render(
        REQUEST, cache=tmp_path, run=tools, region_of_machine=lambda: "eu-west-1"
    )
    git = [c for c in tools.commands if c[0] == "git"]
    assert ["git", "fetch", "--quiet", "--depth", "1", REPOSITORY, COMMIT] in git
    assert ["git", "checkout", "--quiet", COMMIT] in git
    update, template = [c for c in tools.commands if c[0] == "helm"]
    assert update[:3] == ["helm", "dependency", "update"] and update[3].endswith(CHART_PATH)
    assert template[:4] == ["helm", "template", RELEASE, update[3]]
    assert template[template.index("--namespace") + 1] == NAMESPACE
    assert template[template.index("--kube-version") + 1] == "1.33"
    assert "--include-crds" in template  # as `helm install` does with the charts' crds/
    # The deploying machine's region (the stack names none) is the one rendered for.
    assert tools.values == REQUEST.values("eu-west-1")
    handed = json.loads(path.read_text())
    assert handed["region"] == "eu-west-1" and handed["commit"] == COMMIT
    assert handed["release"] == RELEASE
    kinds = [obj["kind"] for obj in handed["objects"]]
    assert kinds.count("DaemonSet") == 3
    # Namespaced objects the chart leaves to the release land in the release's namespace;
    # cluster-wide ones get none.
    for obj in handed["objects"]:
        namespace = obj["metadata"].get("namespace")
        if obj["kind"] in ("Namespace", "ClusterRole"):
            assert namespace is None, obj
        else:
            assert namespace in (NAMESPACE, "aws-hyperpod"), obj
    plugin = next(
        o for o in handed["objects"] if o["metadata"]["name"].endswith("efa-k8s-device-plugin")
    )
    assert plugin["metadata"]["namespace"] == NAMESPACE


def test_a_deployment_with_a_restricted_group_gets_the_rendering_admitted_to_its_nodes(
    tmp_path: Path,
) -> None:
    """The same chart, changed as AWS's RIG dependencies change it (stacks/hyperpod_chart.py
    admit_restricted_nodes) before the checks, and cached apart from the plain rendering."""
    nova = replace(
        REQUEST, region="eu-west-2", kubeflow_training_operator=True,
        restricted_instance_types=("ml.p5.48xlarge",),
    )  # fmt: skip
    tools = Tools(manifest(rendering(kubeflow=True)))
    handed = json.loads(renderer.render(nova, cache=tmp_path, run=tools).read_text())
    tolerating = sorted(
        obj["metadata"]["name"]
        for obj in handed["objects"]
        if "tolerations" in obj.get("spec", {}).get("template", {}).get("spec", {})
    )
    assert tolerating == [
        "hyperpod-dependencies-aws-efa-k8s-device-plugin",
        "hyperpod-dependencies-nvidia-device-plugin",
        "hyperpod-dependencies-training-operators",
    ]
    plain = renderer.render(replace(nova, restricted_instance_types=()), cache=tmp_path, run=tools)
    assert not any(
        "tolerations" in obj.get("spec", {}).get("template", {}).get("spec", {})
        for obj in json.loads(plain.read_text())["objects"]
    )


def test_a_rendering_is_made_once_per_input(tmp_path: Path) -> None:
    tools = Tools(manifest(rendering()))
    first = renderer.render(replace(REQUEST, region="us-east-1"), cache=tmp_path, run=tools)
    again = renderer.render(replace(REQUEST, region="us-east-1"), cache=tmp_path, run=tools)
    assert again == first and len(tools.commands) == 5
    other = renderer.render(replace(REQUEST, region="us-west-2"), cache=tmp_path, run=tools)
    assert other != first and len(tools.commands) == 10
    # Another instance type is checked afresh, even where the values are the same.
    renderer.render(
        replace(REQUEST, region="us-east-1", instance_types=("ml.g5.12xlarge",)),
        cache=tmp_path,
        run=tools,
    )
    assert len(tools.commands) == 15


def test_no_region_anywhere_is_an_error_that_says_where_to_set_one(tmp_path: Path) -> None:
    with pytest.raises(renderer.RenderFailed, match="set `region` in cdk.json or AWS_REGION"):
        renderer.render(REQUEST, cache=tmp_path, run=Tools(""), region_of_machine=lambda: None)


def test_a_missing_tool_is_named_with_how_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(renderer.RenderFailed) as raised:
        renderer.run_tool(["no-such-helm-here", "template"], tmp_path)
    assert "`no-such-helm-here` is not installed" in str(raised.value)


def test_a_failing_tool_reports_its_own_message(tmp_path: Path) -> None:
    with pytest.raises(renderer.RenderFailed) as raised:
        renderer.run_tool(["git", "-C", str(tmp_path), "checkout", "no-such-commit"], tmp_path)
    assert "`git -C" in str(raised.value) and "not a git repository" in str(raised.value)


def test_the_program_prints_the_path_or_fails_the_publish_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(renderer, "CACHE", tmp_path)
    request = replace(REQUEST, region="us-east-1")
    monkeypatch.setattr(renderer, "run_tool", Tools(manifest(rendering())))
    assert renderer.main([request.encode()]) == 0
    printed = capsys.readouterr().out.strip()
    assert Path(printed).is_file() and Path(printed).is_relative_to(tmp_path)

    trainium = replace(request, instance_types=("ml.trn1.32xlarge",))
    assert renderer.main([trainium.encode()]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing cdk-assets would upload
    assert "no neuron-device-plugin DaemonSet in the chart" in captured.err
