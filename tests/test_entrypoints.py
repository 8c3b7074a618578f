"""`cdk synth` (app.py as the CDK CLI runs it) and `mtrl config`: exit codes and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mtrl.cli import app as mtrl
from stacks.config import CDK_JSON
from training_configs.costs import InstancePrices

ROOT = CDK_JSON.parent


def _run_app(context: dict, outdir: Path) -> subprocess.CompletedProcess[str]:
    """Runs app.py the way the CDK CLI does: context (cdk.json + `-c`) in CDK_CONTEXT_JSON."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(outdir),
        "CDK_OUTDIR": str(outdir),
        "CDK_CONTEXT_JSON": json.dumps(context),
        # Offline proof: no credentials and no Docker engine to reach.
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
        "AWS_CONFIG_FILE": "/nonexistent",
        "DOCKER_HOST": "unix:///nonexistent/docker.sock",
    }
    return subprocess.run(
        [sys.executable, "app.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def _cdk_json_context() -> dict:
    return json.loads(CDK_JSON.read_text())["context"]


@pytest.mark.parametrize(
    ("key", "value"),
    [("az_count", "9"), ("hyperpod_instance_groups", "[{"), ("reward_worker_cpu", "3")],
)
def test_bad_context_value_fails_synth_with_one_readable_line(
    tmp_path: Path, key: str, value: str
) -> None:
    result = _run_app({**_cdk_json_context(), key: value}, tmp_path)
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"nova-mtrl: config key '{key}' has invalid value")
    assert "Traceback" not in result.stderr and "jsii" not in result.stderr
    assert not list(tmp_path.glob("*.template.json"))


def test_synth_writes_every_stack_with_no_credentials_or_docker(tmp_path: Path) -> None:
    # No bundling (as `cdk synth --exclusively` of nothing would): the test stays offline.
    result = _run_app({**_cdk_json_context(), "aws:cdk:bundling-stacks": []}, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    written = sorted(path.name for path in tmp_path.glob("*.template.json"))
    assert written == [
        "nova-mtrl-compute.template.json",
        "nova-mtrl-network.template.json",
        "nova-mtrl-pipeline.template.json",
        "nova-mtrl-storage.template.json",
    ]
    types = set()
    for path in tmp_path.glob("*.template.json"):
        types |= {
            resource["Type"] for resource in json.loads(path.read_text())["Resources"].values()
        }
    assert {
        "AWS::EC2::VPC",
        "AWS::EKS::Cluster",
        "AWS::SageMaker::Cluster",
        "AWS::ECS::Cluster",
        "AWS::S3::Bucket",
    } <= types


def test_mtrl_config_shows_the_effective_configuration() -> None:
    result = CliRunner().invoke(
        mtrl,
        ["config", "--json", "-c", "reward_worker_cpu=2048", "-c", "reward_worker_memory_mib=4096"],
    )
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["reward_worker_cpu"] == 2048
    assert shown["name_prefix"] == _cdk_json_context()["name_prefix"]


def test_mtrl_config_shows_what_the_deployment_costs_idle_its_fsx_included() -> None:
    """The default restricted group's FSx bills at any node count: 9,600 GiB at the prices
    file's 250 MB/s/TiB rate, a month of 730 hours; without the group, the platform alone."""
    prices = InstancePrices.load()
    fsx = 9600 * prices.fsx_lustre_per_gb_month[250] / 730
    shown = CliRunner().invoke(mtrl, ["config"])
    assert shown.exit_code == 0, shown.output
    assert f"idle: platform ~${prices.platform_idle_per_hour:,.2f}/hour" in shown.output
    assert (
        f"idle: FSx for Lustre of restricted group 'nova' (9,600 GiB at 250 MB/s/TiB) "
        f"~${fsx:,.2f}/hour (~${fsx * 730:,.0f}/month), at any node count"
    ) in shown.output
    off = CliRunner().invoke(mtrl, ["config", "-c", "nova_restricted_group=false"])
    assert off.exit_code == 0 and "FSx for Lustre" not in off.output
    west = CliRunner().invoke(mtrl, ["config", "-c", "region=eu-west-1"])
    assert "note: no restricted instance group for Nova" in west.output
    assert "FSx for Lustre" not in west.output


def test_mtrl_config_rejects_a_bad_value_with_exit_1() -> None:
    result = CliRunner().invoke(mtrl, ["config", "-c", "eks_version=1.2"])
    assert result.exit_code == 1
    assert "config key 'eks_version' has invalid value \"1.2\"" in result.output


def test_mtrl_config_rejects_malformed_overrides_with_exit_2() -> None:
    result = CliRunner().invoke(mtrl, ["config", "-c", "no-equals-sign"])
    assert result.exit_code == 2
    assert "KEY=VALUE" in result.output
