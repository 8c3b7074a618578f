"""GPU capacity on HyperPod: leases in the runs table (moto), UpdateCluster requests (a recorded
fake: moto has no UpdateCluster) — up for a run, to zero only when no run holds the group."""

from __future__ import annotations

import copy

import boto3
import pytest

from lambdas.pipeline.hyperpod_capacity import CapacityBusy, CapacityLeases, HyperPodCapacity
from mtrl.runs import RunStore, create_runs_table

GROUPS = [
    {
        "InstanceGroupName": "system", "InstanceType": "ml.m5.2xlarge", "CurrentCount": 1,
        "TargetCount": 1, "Status": "InService", "ExecutionRole": "arn:aws:iam::123456789012:role/hp",
        "LifeCycleConfig": {"SourceS3Uri": "s3://sagemaker-lc/", "OnCreate": "on_create.sh"},
        "ThreadsPerCore": 1, "CurrentImageId": "ami-1", "DesiredImageId": "ami-1",
    },
    {
        "InstanceGroupName": "gpu", "InstanceType": "ml.p5.48xlarge", "CurrentCount": 0,
        "TargetCount": 0, "Status": "InService", "ExecutionRole": "arn:aws:iam::123456789012:role/hp",
        "LifeCycleConfig": {"SourceS3Uri": "s3://sagemaker-lc/", "OnCreate": "on_create.sh"},
        "ThreadsPerCore": 1, "OnStartDeepHealthChecks": ["InstanceStress"],
    },
]  # fmt: skip


class FakeSageMaker:
    """DescribeCluster / UpdateCluster / ListClusterNodes of one cluster; requests recorded."""

    def __init__(self) -> None:
        self.meta = boto3.client("sagemaker").meta
        self.groups = copy.deepcopy(GROUPS)
        self.updates: list[dict] = []

    def describe_cluster(self, ClusterName: str) -> dict:  # noqa: N803
        assert ClusterName == "nova-mtrl"
        return {"ClusterName": ClusterName, "InstanceGroups": copy.deepcopy(self.groups)}

    def update_cluster(self, **request: object) -> dict:
        self.updates.append(copy.deepcopy(request))
        for spec in request["InstanceGroups"]:  # type: ignore[union-attr]
            for group in self.groups:
                if group["InstanceGroupName"] == spec["InstanceGroupName"]:
                    group["TargetCount"] = spec["InstanceCount"]
        return {"ClusterArn": "arn:aws:sagemaker:us-east-1:123456789012:cluster/x"}

    def get_paginator(self, name: str) -> object:
        groups = self.groups

        class Pages:
            def paginate(self, **_: object) -> list[dict]:
                nodes = [
                    {"InstanceGroupName": g["InstanceGroupName"], "InstanceStatus": {"Status": "Running"}}
                    for g in groups for _ in range(g["TargetCount"])
                ] + [{"InstanceGroupName": "gpu", "InstanceStatus": {"Status": "Pending"}}]  # fmt: skip
                return [{"ClusterNodeSummaries": nodes}]

        assert name == "list_cluster_nodes"
        return Pages()


@pytest.fixture
def capacity(aws: None) -> HyperPodCapacity:
    db = boto3.client("dynamodb")
    create_runs_table(db, "runs")
    leases = CapacityLeases(db, "runs")
    return HyperPodCapacity(FakeSageMaker(), leases, cluster="nova-mtrl", instance_group="gpu")


def test_scale_up_sends_every_group_with_the_one_count_changed(capacity: HyperPodCapacity) -> None:
    assert capacity.scale_up("run-a", 4) == 4
    (update,) = capacity._sagemaker.updates
    assert update["ClusterName"] == "nova-mtrl"
    system, gpu = update["InstanceGroups"]
    assert system == {
        "InstanceGroupName": "system", "InstanceType": "ml.m5.2xlarge", "InstanceCount": 1,
        "ExecutionRole": "arn:aws:iam::123456789012:role/hp", "ThreadsPerCore": 1,
        "LifeCycleConfig": {"SourceS3Uri": "s3://sagemaker-lc/", "OnCreate": "on_create.sh"},
    }  # fmt: skip
    assert gpu["InstanceCount"] == 4 and gpu["OnStartDeepHealthChecks"] == ["InstanceStress"]
    assert capacity.ready_nodes() == 4  # running nodes of the group only


def test_the_group_goes_to_zero_only_when_the_last_run_ends(capacity: HyperPodCapacity) -> None:
    capacity.scale_up("run-a", 4)
    capacity.scale_up("run-b", 2)  # already enough: no request
    assert len(capacity._sagemaker.updates) == 1
    assert capacity.scale_down("run-a") is False
    assert capacity._sagemaker.groups[1]["TargetCount"] == 4
    assert capacity.scale_down("run-b") is True
    assert capacity._sagemaker.updates[-1]["InstanceGroups"][1]["InstanceCount"] == 0
    assert capacity.scale_down("run-b") is False  # repeated: nothing more to do
    assert len(capacity._sagemaker.updates) == 2


def test_leases_are_not_runs(capacity: HyperPodCapacity) -> None:
    capacity.scale_up("run-a", 1)
    assert RunStore(boto3.client("dynamodb"), "runs").unfinished() == []


def test_the_lock_keeps_decisions_apart_and_expires(aws: None) -> None:
    db = boto3.client("dynamodb")
    create_runs_table(db, "runs")
    now = [1000.0]
    leases = CapacityLeases(
        db, "runs", clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s)
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
