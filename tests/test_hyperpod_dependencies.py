"""The HyperPod Helm chart install in the synthesized compute stack: the HyperPod cluster waits
for it (so CloudFormation also removes it after the cluster), the rendering is made at publish
time by our renderer from this deployment's request, and the installer may read exactly that
rendering and act on the cluster as its admin."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from stacks.components.hyperpod_dependencies import chart_request
from stacks.hyperpod_chart import COMMIT, ChartRequest
from stacks.render_hyperpod_chart import __name__ as RENDERER
from tests.conftest import Synthesized, role_statements, synthesize

CLUSTER_ADMIN = "AmazonEKSClusterAdminPolicy"


def _chart(app: Synthesized) -> tuple[str, dict[str, Any]]:
    return app.one("compute", "Custom::HyperPodHelmChart")


def _executable_assets(app: Synthesized) -> dict[str, dict[str, Any]]:
    manifest = json.loads(
        (app.outdir / f"{app.config.name_prefix}-compute.assets.json").read_text()
    )
    return {
        key: asset for key, asset in manifest["files"].items() if "executable" in asset["source"]
    }


@pytest.mark.parametrize("variant", ["default", "pinned", "existing"])
def test_the_hyperpod_cluster_waits_for_the_chart(
    every_app: dict[str, Synthesized], variant: str
) -> None:
    app = every_app[variant]
    chart_id, chart = _chart(app)
    _, cluster = app.one("compute", "AWS::SageMaker::Cluster")
    assert chart_id in cluster["DependsOn"]
    assert chart["Properties"]["Commit"] == COMMIT
    assert chart["Properties"]["ServiceTimeout"] == "900"


def test_the_rendering_is_made_at_publish_time_by_our_renderer(pinned_app: Synthesized) -> None:
    _, chart = _chart(pinned_app)
    ((key, asset),) = _executable_assets(pinned_app).items()
    assert chart["Properties"]["Manifest"]["Key"] == key
    python, flag, module, argument = asset["source"]["executable"]
    assert (python, flag, module) == (sys.executable, "-m", RENDERER)
    request = ChartRequest.decode(argument)
    assert request == chart_request(pinned_app.config)
    assert request.region == "us-east-1" and request.kube_version == pinned_app.config.eks_version
    (destination,) = asset["destinations"].values()
    # An environment-specific stack names the bootstrap's bucket outright.
    assert chart["Properties"]["Manifest"]["Bucket"] == destination["bucketName"]


def test_the_installer_reads_only_its_rendering_and_is_the_clusters_admin(
    default_app: Synthesized,
) -> None:
    template = default_app.template("compute")
    chart_id, chart = _chart(default_app)
    function_id = chart["Properties"]["ServiceToken"]["Fn::GetAtt"][0]
    function = template["Resources"][function_id]
    assert function["Properties"]["Handler"] == "lambdas.kubernetes.chart_install.on_event"
    role = function["Properties"]["Role"]["Fn::GetAtt"][0]
    manifest = chart["Properties"]["Manifest"]
    reads = [
        statement["Resource"]
        for statement in role_statements(template, role)
        if "s3:GetObject" in statement["Action"]
    ]
    assert json.dumps(reads[0]).count(manifest["Key"]) == 1 and len(reads) == 1
    (entry_id,) = [
        d for d in chart["DependsOn"] if template["Resources"][d]["Type"] == "AWS::EKS::AccessEntry"
    ]
    entry = template["Resources"][entry_id]["Properties"]
    # After the add-ons on the nodes: the chart's pods need them, restricted groups copies.
    waits_for = {template["Resources"][d]["Type"] for d in chart["DependsOn"]}
    assert {"AWS::EKS::Addon", "AWS::EKS::Nodegroup"} <= waits_for
    assert entry["PrincipalArn"] == {"Fn::GetAtt": [role, "Arn"]}
    (policy,) = entry["AccessPolicies"]
    assert policy["AccessScope"]["Type"] == "cluster"
    assert json.dumps(policy["PolicyArn"]).endswith(
        f':eks::aws:cluster-access-policy/{CLUSTER_ADMIN}"]]}}'
    )


def test_no_install_for_an_existing_hyperpod_cluster_or_when_turned_off(
    existing_hyperpod_app: Synthesized, tmp_path_factory: pytest.TempPathFactory
) -> None:
    assert not existing_hyperpod_app.resources("compute", "Custom::HyperPodHelmChart")
    assert not _executable_assets(existing_hyperpod_app)
    off = synthesize({"install_hyperpod_chart": False}, tmp_path_factory.mktemp("no-chart"))
    assert not off.resources("compute", "Custom::HyperPodHelmChart")
    _, cluster = off.one("compute", "AWS::SageMaker::Cluster")
    assert cluster["Properties"]["ClusterName"]  # the cluster itself is still there
