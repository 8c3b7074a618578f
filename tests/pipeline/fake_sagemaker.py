"""A recorded SageMaker fake for one HyperPod cluster: moto has no UpdateCluster."""

from __future__ import annotations

import copy

import boto3

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
        return {
            "ClusterName": ClusterName,
            "ClusterStatus": "InService",
            "InstanceGroups": copy.deepcopy(self.groups),
        }

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
