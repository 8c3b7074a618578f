"""AWS's HyperPod Helm chart as the platform installs it (stacks/hyperpod_chart.py): the parts
turned on against what AWS's own cluster stack turns on, the checks a rendering must pass
before a deploy goes on, and that every accelerator a run's pods ask for is advertised by a
plugin the chart installs."""

from __future__ import annotations

from dataclasses import replace
from importlib.resources import files

import pytest
import yaml

from domain.rig_addons import RESTRICTED_TAINT
from lambdas.kubernetes.training_job import render
from stacks.components.hyperpod_dependencies import chart_request
from stacks.config import PlatformConfig, deployment_context
from stacks.hyperpod_chart import (
    COMMIT,
    ChartRequest,
    Part,
    RenderingError,
    admit_restricted_nodes,
    advertised,
    check_rendering,
    parts_needed,
)
from tests.chart_rendering import TRAINING_OPERATOR, rendering
from tests.kubernetes.test_training_job import request as job_request

P5 = ChartRequest(
    kube_version="1.33",
    region="us-east-1",
    instance_types=("ml.p5.48xlarge",),
    kubeflow_training_operator=False,
)
# Parts of the chart AWS's cluster stack turns on that this platform leaves off, and why.
LEFT_OFF = {
    "mlflow": "no MLflow on the cluster (experiment tracking is its own issue)",
    "trainingOperators": "Kubeflow's operator only for PyTorchJob; HyperPod's is an EKS add-on",
    "mpi-operator": "the platform's jobs are PyTorch jobs, never MPI jobs",
    "cluster-role-and-bindings": "the pipeline's RBAC is its own (domain/kubernetes_rbac.py)",
    "namespaced-role-and-bindings": "the pipeline's RBAC is its own (domain/kubernetes_rbac.py)",
    "neuron-device-plugin.devicePlugin": "only for Trainium and Inferentia instance types",
}


def aws_helm_operators() -> dict[str, bool]:
    """The `HelmOperators` default of AWS's HyperPod cluster stack (PyPI
    hyperpod-cluster-stack-template 1.0.2, creation_template.yaml): `<part>.enabled=true,...`."""
    template = yaml.safe_load(
        (files("hyperpod_cluster_stack_template") / "creation_template.yaml").read_text()
    )
    default = template["Parameters"]["HelmOperators"]["Default"]
    settings = dict(item.split("=") for item in default.split(","))
    return {
        key.removesuffix(".enabled").removesuffix(".enable"): v == "true"
        for key, v in settings.items()
    }


def _enabled(values: dict, part: str) -> bool:
    node = values
    for key in part.split("."):
        node = node[key]
    return node["enabled"]


def test_every_part_aws_turns_on_is_on_or_left_off_for_a_stated_reason() -> None:
    aws = aws_helm_operators()
    assert aws["health-monitoring-agent"] and aws["deep-health-check"]  # the source reads right
    values = P5.values("us-east-1")
    for part, on in aws.items():
        if on and part not in LEFT_OFF:
            assert _enabled(values, part), part
        if part in LEFT_OFF:
            assert not _enabled(values, part), part
    for part in ("health-monitoring-agent", "deep-health-check", "job-auto-restart",
                 "hyperpod-patching"):  # fmt: skip
        assert _enabled(values, part)


def test_what_the_add_ons_install_is_not_installed_twice() -> None:
    values = P5.values("us-east-1")
    assert not values["cert-manager"]["enabled"]
    assert not values["trainingOperators"]["enabled"]
    kubeflow = replace(P5, kubeflow_training_operator=True).values("us-east-1")
    assert kubeflow["trainingOperators"]["enabled"]


def test_device_plugins_follow_the_instance_types() -> None:
    values = P5.values("us-west-2")
    assert values["global"] == {"region": "us-west-2"}  # the health agent's image registry
    assert values["nvidia-device-plugin"]["devicePlugin"]["enabled"]
    assert values["aws-efa-k8s-device-plugin"]["devicePlugin"]["enabled"]
    assert not values["neuron-device-plugin"]["devicePlugin"]["enabled"]
    trainium = replace(P5, instance_types=("ml.trn1.32xlarge",)).values("us-west-2")
    assert trainium["neuron-device-plugin"]["devicePlugin"]["enabled"]
    assert not trainium["nvidia-device-plugin"]["devicePlugin"]["enabled"]
    # A GPU type without EFA interfaces gets no EFA plugin.
    assert parts_needed("ml.g5.xlarge") == {Part.NVIDIA, Part.HEALTH_AGENT}


def test_the_request_is_one_shell_safe_argument_that_round_trips() -> None:
    argument = P5.encode()
    assert argument.replace("-", "").replace("_", "").replace("=", "").isalnum()
    assert ChartRequest.decode(argument) == P5


def test_a_rendering_with_the_needed_daemonsets_passes() -> None:
    check_rendering(rendering(), P5)


@pytest.mark.parametrize(
    ("objects", "problem"),
    [
        (rendering(plugins=("aws-efa-k8s-device-plugin",)),
         "no nvidia-device-plugin DaemonSet in the chart, needed on ml.p5.48xlarge"),
        (rendering(affinity={"health-monitoring-agent": ["ml.g5.12xlarge"]}),
         "health-monitoring-agent does not run on ml.p5.48xlarge"),
        (rendering(affinity={"aws-efa-k8s-device-plugin": []}),
         "aws-efa-k8s-device-plugin does not run on ml.p5.48xlarge"),
        ([*rendering(), {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                         "metadata": {"name": "pdb"}}],
         "PodDisruptionBudget pdb (policy/v1): a kind domain/kubernetes_kinds.py does not know"),
    ],
)  # fmt: skip
def test_a_rendering_missing_a_part_stops_the_deploy_naming_it(
    objects: list[dict], problem: str
) -> None:
    with pytest.raises(RenderingError) as raised:
        check_rendering(objects, P5)
    assert problem in str(raised.value)
    assert COMMIT[:12] in str(raised.value)


NOVA = replace(P5, kubeflow_training_operator=True, restricted_instance_types=("ml.p5.48xlarge",))


def _spec(objects: list[dict], name: str) -> dict:
    (found,) = [o for o in objects if o["metadata"]["name"] == name and "spec" in o]
    return found["spec"]["template"]["spec"]


def test_on_restricted_groups_the_device_plugins_and_operator_tolerate_rig_nodes() -> None:
    """As AWS's RIG dependencies (sagemaker-hyperpod-cli release_v2,
    helm_chart/install_rig_dependencies.sh, HyperPodHelmChartForRIG/values.yaml): the device
    plugins run on restricted nodes (the EFA plugin's image from the cluster's region), the
    Kubeflow operator may too but prefers other nodes; the health agent is left as it is."""
    original = rendering(kubeflow=True)
    snapshot = yaml.safe_dump(original)
    admitted = admit_restricted_nodes(original, region="eu-west-2")
    assert yaml.safe_dump(original) == snapshot  # a changed copy, the rendering untouched
    for plugin in ("nvidia-device-plugin", "aws-efa-k8s-device-plugin"):
        spec = _spec(admitted, f"hyperpod-dependencies-{plugin}")
        assert spec["tolerations"] == [RESTRICTED_TAINT]
    efa = _spec(admitted, "hyperpod-dependencies-aws-efa-k8s-device-plugin")["containers"][0]
    assert efa["image"] == (
        "602401143452.dkr.ecr.eu-west-2.amazonaws.com/eks/aws-efa-k8s-device-plugin:v0.5.6"
    )
    nvidia = _spec(admitted, "hyperpod-dependencies-nvidia-device-plugin")["containers"][0]
    assert nvidia["image"] == "nvcr.io/nvidia/k8s-device-plugin:v0.16.1"
    assert "tolerations" not in _spec(admitted, "health-monitoring-agent")
    operator = _spec(admitted, TRAINING_OPERATOR["metadata"]["name"])
    assert operator["tolerations"] == [RESTRICTED_TAINT]
    assert operator["affinity"]["nodeAffinity"] == {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "preference": {
            "matchExpressions": [{"key": "sagemaker.amazonaws.com/instance-group-type",
                                  "operator": "NotIn", "values": ["Restricted"]}]}}]
    }  # fmt: skip
    # Admitting twice adds nothing more.
    assert admit_restricted_nodes(admitted, region="eu-west-2") == admitted
    check_rendering(admitted, NOVA)


def test_a_rendering_whose_plugins_shun_restricted_nodes_stops_a_nova_deploy() -> None:
    with pytest.raises(RenderingError) as raised:
        check_rendering(rendering(kubeflow=True), NOVA)
    assert str(raised.value).count("does not tolerate the restricted group's taint") == 2
    assert "aws-efa-k8s-device-plugin does not tolerate" in str(raised.value)
    check_rendering(rendering(kubeflow=True), replace(NOVA, restricted_instance_types=()))
    # A toleration of every taint will do.
    everything = rendering(kubeflow=True)
    for obj in everything:
        if obj["kind"] == "DaemonSet":
            obj["spec"]["template"]["spec"]["tolerations"] = [{"operator": "Exists"}]
    check_rendering(everything, NOVA)


def test_kubeflow_jobs_need_the_chart_to_bring_their_crd() -> None:
    kubeflow = replace(P5, kubeflow_training_operator=True)
    with pytest.raises(
        RenderingError, match="no CustomResourceDefinition pytorchjobs.kubeflow.org"
    ):
        check_rendering(rendering(), kubeflow)
    check_rendering(rendering(kubeflow=True), kubeflow)


def test_a_trainium_group_needs_the_neuron_plugin() -> None:
    trainium = replace(P5, instance_types=("ml.trn1.32xlarge",))
    with pytest.raises(RenderingError, match="no neuron-device-plugin DaemonSet"):
        check_rendering(rendering(), trainium)
    check_rendering(
        rendering(plugins=("aws-efa-k8s-device-plugin", "neuron-device-plugin"),
                  affinity={"health-monitoring-agent": ["ml.trn1.32xlarge"]}),
        trainium,
    )  # fmt: skip


def _requested(objects: list[dict]) -> set[str]:
    """Extended resources (a domain in the name) the objects' pods ask at least one of."""
    found = set()
    for obj in objects:
        spec = obj.get("spec", {})
        templates = (
            [spec.get("template")]
            + [replica.get("template") for replica in spec.get("replicaSpecs", [])]
            + [r.get("template") for r in spec.get("pytorchReplicaSpecs", {}).values()]
        )
        for template in filter(None, templates):
            for container in template["spec"]["containers"]:
                for amounts in container.get("resources", {}).values():
                    found |= {name for name, amount in amounts.items()
                              if "/" in name and int(amount) > 0}  # fmt: skip
    return found


@pytest.mark.parametrize("kind", ["HyperPodPyTorchJob", "PyTorchJob"])
@pytest.mark.parametrize("model", ["qwen3-8b"])
@pytest.mark.parametrize("config", ["rft_multiturn_lora", "rft_multiturn_full"])
def test_every_accelerator_a_run_asks_for_is_advertised_by_an_installed_plugin(
    kind: str, model: str, config: str
) -> None:
    deployment = PlatformConfig.from_context(deployment_context())
    objects = render(replace(job_request(config, model=model), kind=kind))
    wanted = _requested(objects)
    assert "nvidia.com/gpu" in wanted  # the pods were read
    group_types = chart_request(deployment).instance_types
    assert wanted <= advertised(group_types)
    # ... and the check bites: a Trainium-only deployment advertises no NVIDIA GPUs.
    assert not wanted <= advertised(["ml.trn1.32xlarge"])
