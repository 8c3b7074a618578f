"""GPU capacity on HyperPod: leases in their table (moto), UpdateCluster requests (a recorded
fake: moto has no UpdateCluster) — up for a run, to zero only when no run holds the group."""

from __future__ import annotations

import copy

import boto3
import pytest

from lambdas.pipeline.hyperpod_capacity import CapacityBusy, CapacityLeases, HyperPodCapacity
from tests.aws import Recorded, create_leases_table
from tests.service_fakes import FakeSageMaker


@pytest.fixture
def sagemaker(aws: None) -> FakeSageMaker:
    return FakeSageMaker()


@pytest.fixture
def capacity(sagemaker: FakeSageMaker) -> HyperPodCapacity:
    db = boto3.client("dynamodb")
    create_leases_table(db, "leases")
    leases = CapacityLeases(db, "leases")
    return HyperPodCapacity(sagemaker.client(), leases, cluster="nova-mtrl", instance_group="gpu")


def test_scale_up_sends_every_group_with_the_one_count_changed(
    capacity: HyperPodCapacity, sagemaker: FakeSageMaker
) -> None:
    assert capacity.scale_up("run-a", 4) == 4
    (update,) = sagemaker.operations("UpdateCluster")
    assert update["ClusterName"] == "nova-mtrl"
    system, gpu = update["InstanceGroups"]
    assert system == {
        "InstanceGroupName": "system", "InstanceType": "ml.m5.2xlarge", "InstanceCount": 1,
        "ExecutionRole": "arn:aws:iam::123456789012:role/hp", "ThreadsPerCore": 1,
        "LifeCycleConfig": {"SourceS3Uri": "s3://sagemaker-lc/", "OnCreate": "on_create.sh"},
    }  # fmt: skip
    assert gpu["InstanceCount"] == 4 and gpu["OnStartDeepHealthChecks"] == ["InstanceStress"]
    assert capacity.ready_nodes() == 4  # running nodes of the group only


def test_a_group_keeps_what_was_last_asked_for_in_update_clusters_terms(
    capacity: HyperPodCapacity, sagemaker: FakeSageMaker
) -> None:
    """DescribeCluster shows labels, taints, instance types and patching under other names
    and shapes than UpdateCluster takes (botocore validates the request, as AWS would)."""
    capacity.scale_up("run-a", 2)
    (update,) = sagemaker.operations("UpdateCluster")
    gpu = update["InstanceGroups"][1]
    assert gpu["KubernetesConfig"] == {
        "Labels": {"team": "rl", "tier": "gpu"},  # the desired labels, not the current ones
        "Taints": [{"Key": "gpu", "Value": "true", "Effect": "NoSchedule"}],
    }
    assert gpu["InstanceRequirements"] == {"InstanceTypes": ["ml.p5.48xlarge"]}
    assert gpu["AutoPatchConfig"] == {"PatchingStrategy": "ROLLING"}
    assert "ImageId" not in update["InstanceGroups"][0]  # a capacity change is not an image change


def test_a_restricted_group_is_scaled_among_the_restricted_groups_alone(
    sagemaker: FakeSageMaker,
) -> None:
    """A Nova group is one of the cluster's RestrictedInstanceGroups: UpdateCluster gets those
    (as the Nova Forge SDK's scale_cluster sends them) with the execution role and FSx for
    Lustre they have, and nothing of the standard groups; botocore validates the request
    against ClusterRestrictedInstanceGroupSpecification, whose EnvironmentConfig has no
    S3OutputPath (DescribeCluster shows it; UpdateCluster does not take it)."""
    db = boto3.client("dynamodb")
    create_leases_table(db, "leases")
    nova = HyperPodCapacity(
        sagemaker.client(), CapacityLeases(db, "leases"), cluster="nova-mtrl",
        instance_group="nova", restricted=True,
    )  # fmt: skip
    assert nova.scale_up("run-a", 6) == 6
    (update,) = sagemaker.operations("UpdateCluster")
    assert set(update) == {"ClusterName", "RestrictedInstanceGroups"}
    assert update["RestrictedInstanceGroups"] == [
        {
            "InstanceGroupName": "nova", "InstanceType": "ml.p5.48xlarge", "InstanceCount": 6,
            "ExecutionRole": "arn:aws:iam::123456789012:role/nova-rig", "ThreadsPerCore": 1,
            "EnvironmentConfig": {
                "FSxLustreConfig": {"SizeInGiB": 1200, "PerUnitStorageThroughput": 250}
            },
        }
    ]  # fmt: skip
    assert nova.ready_nodes() == 6
    assert [g["TargetCount"] for g in sagemaker.groups] == [1, 0]  # the standard ones as they were
    assert nova.scale_down("run-a", now=0.0)
    assert sagemaker.restricted[0]["TargetCount"] == 0


def test_nodes_are_counted_for_the_group_by_its_exact_name(
    capacity: HyperPodCapacity, sagemaker: FakeSageMaker
) -> None:
    """ListClusterNodes filters by `InstanceGroupNameContains`, a substring of the group's name
    (botocore's sagemaker model, ListClusterNodesRequest): a group named `gpu-spare` matches
    `gpu` too, so only nodes of the group itself count."""
    request = boto3.client("sagemaker", region_name="us-east-1").meta.service_model
    members = request.operation_model("ListClusterNodes").input_shape.members
    assert "InstanceGroupNameContains" in members
    spare = {**copy.deepcopy(sagemaker.groups[1]), "InstanceGroupName": "gpu-spare"}
    sagemaker.groups.append({**spare, "TargetCount": 3})
    capacity.scale_up("run-a", 2)
    assert capacity.ready_nodes() == 2
    (listed,) = sagemaker.operations("ListClusterNodes")
    assert listed == {"ClusterName": "nova-mtrl", "InstanceGroupNameContains": "gpu"}


def test_the_group_goes_to_zero_only_when_the_last_run_ends(
    capacity: HyperPodCapacity, sagemaker: FakeSageMaker
) -> None:
    capacity.scale_up("run-a", 4)
    capacity.scale_up("run-b", 2)  # already enough: no request
    assert len(sagemaker.updates) == 1
    assert capacity.scale_down("run-a", now=1.0) is False
    assert sagemaker.groups[1]["TargetCount"] == 4
    assert capacity.scale_down("run-b", now=1.0) is True
    assert sagemaker.updates[-1]["InstanceGroups"][1]["InstanceCount"] == 0
    assert capacity.scale_down("run-b", now=1.0) is False  # repeated: nothing more to do
    assert len(sagemaker.updates) == 2


def test_the_lock_keeps_decisions_apart_and_expires(aws: None) -> None:
    db = boto3.client("dynamodb")
    create_leases_table(db, "leases")
    now = [1000.0]
    leases = CapacityLeases(
        db, "leases", clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s)
    )
    with leases.locked("nova-mtrl/gpu"):
        started = now[0]
        with (
            pytest.raises(CapacityBusy, match="locked by another run"),
            leases.locked("nova-mtrl/gpu"),
        ):
            pass
        assert now[0] - started >= 30  # it waited before giving up
        now[0] += 61  # the holder died: its lock expires
        with leases.locked("nova-mtrl/gpu"):
            pass
    waited = now[0]
    with leases.locked("nova-mtrl/gpu"):  # released after each block: no wait
        assert now[0] == waited


def test_keep_warm_leaves_nodes_up_until_the_period_passes(
    capacity: HyperPodCapacity, sagemaker: FakeSageMaker
) -> None:
    capacity.scale_up("run-a", 4)
    assert capacity.scale_down("run-a", keep_warm_seconds=600, now=2000.0) is False
    assert capacity.scale_idle(keep_warm_seconds=600, now=2599.0) is False
    assert len(sagemaker.updates) == 1  # still only the scale-up
    assert capacity.scale_idle(keep_warm_seconds=600, now=2600.0) is True
    assert sagemaker.updates[-1]["InstanceGroups"][1]["InstanceCount"] == 0
    assert capacity.scale_idle(keep_warm_seconds=600, now=9999.0) is False  # already at zero


def test_a_run_taking_the_group_while_warm_cancels_the_idle_mark(
    capacity: HyperPodCapacity, sagemaker: FakeSageMaker
) -> None:
    capacity.scale_up("run-a", 4)
    capacity.scale_down("run-a", keep_warm_seconds=600, now=2000.0)
    capacity.scale_up("run-b", 4)  # reuses the warm nodes: no UpdateCluster
    assert len(sagemaker.updates) == 1
    assert capacity.scale_idle(keep_warm_seconds=600, now=5000.0) is False
    capacity.scale_down("run-b", keep_warm_seconds=600, now=5000.0)
    assert capacity.scale_idle(keep_warm_seconds=600, now=5600.0) is True


def test_unheld_nodes_go_to_zero_on_request_whatever_the_keep_warm(
    capacity: HyperPodCapacity, sagemaker: FakeSageMaker
) -> None:
    capacity.scale_up("run-a", 4)
    assert capacity.scale_unheld() is False  # run-a holds it
    capacity.scale_down("run-a", keep_warm_seconds=3600, now=2000.0)
    assert capacity.scale_unheld() is True
    assert sagemaker.groups[1]["TargetCount"] == 0
    assert capacity.scale_unheld() is False  # already at zero


def test_any_keep_warm_period_keeps_the_nodes_until_it_passes(
    capacity: HyperPodCapacity, sagemaker: FakeSageMaker
) -> None:
    capacity.scale_up("run-a", 4)
    assert capacity.scale_down("run-a", keep_warm_seconds=1, now=2000.0) is False
    assert sagemaker.groups[1]["TargetCount"] == 4
    assert capacity.scale_idle(keep_warm_seconds=1, now=2001.0) is True


def test_a_group_the_cluster_does_not_have_is_named(sagemaker: FakeSageMaker) -> None:
    db = boto3.client("dynamodb")
    create_leases_table(db, "leases")
    capacity = HyperPodCapacity(
        sagemaker.client(), CapacityLeases(db, "leases"), cluster="nova-mtrl", instance_group="p4"
    )
    with pytest.raises(
        LookupError, match="^HyperPod cluster nova-mtrl has no instance group 'p4'$"
    ):
        capacity.scale_up("run-a", 2)
    # A cluster without restricted groups has none to show (DescribeCluster leaves them out).
    sagemaker.restricted = []
    nova = HyperPodCapacity(
        sagemaker.client(), CapacityLeases(db, "leases"), cluster="nova-mtrl",
        instance_group="nova", restricted=True,
    )  # fmt: skip
    with pytest.raises(
        LookupError, match="^HyperPod cluster nova-mtrl has no instance group 'nova'$"
    ):
        nova.scale_up("run-a", 2)


def test_decisions_read_the_leases_consistently(sagemaker: FakeSageMaker) -> None:
    """Whether any run still holds the group decides a scale to zero: never a stale read."""
    db = Recorded(boto3.client("dynamodb"))
    create_leases_table(db, "leases")
    capacity = HyperPodCapacity(
        sagemaker.client(), CapacityLeases(db, "leases"), cluster="nova-mtrl", instance_group="gpu"
    )
    capacity.scale_up("run-a", 2)
    capacity.scale_down("run-a", keep_warm_seconds=60, now=1.0)
    capacity.scale_idle(keep_warm_seconds=60, now=100.0)
    capacity.scale_unheld()
    reads = db.sent("get_item")
    assert len(reads) == 2 and all(read["ConsistentRead"] is True for read in reads)


def _lists_of_structures(shape, path: str = "") -> dict[str, str]:
    found = {}
    for name, member in shape.members.items():
        if member.type_name == "list" and member.member.type_name == "structure":
            found[path + name] = member.member.name
        elif member.type_name == "structure":
            found |= _lists_of_structures(member, f"{path}{name}.")
    return found


@pytest.mark.parametrize("member", ["InstanceGroups", "RestrictedInstanceGroups"])
def test_list_members_have_the_same_item_shapes_in_describe_and_update_cluster(
    member: str,
) -> None:
    """Why as_update copies lists as they are (botocore's SageMaker model): each list of
    structures UpdateCluster takes in a group has the item shape DescribeCluster shows."""
    model = boto3.client("sagemaker", region_name="us-east-1").meta.service_model
    update = model.operation_model("UpdateCluster").input_shape.members[member].member
    described = model.operation_model("DescribeCluster").output_shape.members[member]
    shown = _lists_of_structures(described.member)
    taken = _lists_of_structures(update)
    assert taken  # Taints, storage configs, rollback alarms
    for path, item in taken.items():
        parent, _, name = path.rpartition(".")
        prefix = f"{parent}." if parent else ""
        sources = [f"{prefix}{name}", f"{prefix}Desired{name}", f"{prefix}Current{name}"]
        assert {shown[source] for source in sources if source in shown} == {item}, path
