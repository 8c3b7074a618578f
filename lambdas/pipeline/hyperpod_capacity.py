"""GPU capacity on HyperPod: scale an instance group up for a run, and to zero when no run needs it.

Runs hold a lease on the instance group: a string set of run ids, one item per group in the
capacity-leases table (the training plane's own, stacks/components/training_control.py). Taking or
returning it, deciding the count and asking HyperPod for it happen under a short lock on that
item (a conditional write that expires), so a run ending never scales to zero under a run that
has just started: `scale_up` takes the lease and raises the group's count to what the run needs
(never lowers it); `scale_down` returns it and sets the count to zero when no run holds it —
or, with a keep-warm period, marks the group idle and `scale_idle` (the reaper, on a schedule)
sets it to zero once the period has passed with no run taking it again.

UpdateCluster replaces the instance groups it is given, so each call sends every group as
DescribeCluster shows it, with the one count changed. A Nova restricted instance group is scaled
the same way among the cluster's `RestrictedInstanceGroups`, sent alone as the Nova Forge SDK
does (amzn-nova-forge 1.4.10, `SMHPRuntimeManager.scale_cluster`): each kind of group is a
member of its own in UpdateCluster's request. The two operations' models differ in names
and shapes (DescribeCluster's `TargetCount`, `DesiredLabels`, `DesiredInstanceTypes`, ... are
UpdateCluster's `InstanceCount`, `Labels`, `InstanceTypes`), so a group is translated member by
member, guided by botocore's model of UpdateCluster's input.
boto3 rather than sagemaker-core: that one installs ~420 MB of dependencies, over Lambda's limit.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from domain.tables import LEASE_KEY

# UpdateCluster's names for what DescribeCluster calls otherwise (besides Desired*/Current*).
_DESCRIBED_AS = {"InstanceCount": "TargetCount", "MinInstanceCount": "MinCount"}
# Left out so a capacity change never asks for an image change as well.
_UNCHANGED = frozenset({"ImageId", "ImageReleaseVersion"})


IDLE = "idle_since"  # set when the last run lets go under a keep-warm period
LOCK_SECONDS = 60  # a lock older than this was left by a function that died
LOCK_WAIT_SECONDS = 30


class CapacityBusy(RuntimeError):
    """Another run held the capacity lock for too long (Step Functions retries the state)."""


class CapacityLeases:
    """Which runs hold an instance group (an item per `<cluster>/<group>` of the leases table)."""

    def __init__(
        self,
        dynamodb: Any,
        table: str,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._db, self._table = dynamodb, table
        self._clock, self._sleep = clock, sleep

    @contextmanager
    def locked(self, group: str) -> Iterator[None]:
        """Hold the group's lock for the block (waits up to LOCK_WAIT_SECONDS for it)."""
        owner, key = secrets.token_hex(8), self._key(group)
        deadline = self._clock() + LOCK_WAIT_SECONDS
        while True:
            now = self._clock()
            try:
                self._db.update_item(
                    TableName=self._table,
                    Key=key,
                    UpdateExpression="SET lock_owner = :owner, lock_until = :until",
                    ConditionExpression="attribute_not_exists(lock_until) OR lock_until < :now",
                    ExpressionAttributeValues={
                        ":owner": {"S": owner},
                        ":until": {"N": str(now + LOCK_SECONDS)},
                        ":now": {"N": str(now)},
                    },
                )
                break
            except self._db.exceptions.ConditionalCheckFailedException:
                if self._clock() > deadline:
                    raise CapacityBusy(f"capacity of {group} is locked by another run") from None
                self._sleep(0.5)
        try:
            yield
        finally:
            # A lock that expired meanwhile belongs to someone else now: leave it.
            with contextlib.suppress(self._db.exceptions.ConditionalCheckFailedException):
                self._db.update_item(
                    TableName=self._table,
                    Key=key,
                    UpdateExpression="REMOVE lock_owner, lock_until",
                    ConditionExpression="lock_owner = :owner",
                    ExpressionAttributeValues={":owner": {"S": owner}},
                )

    def acquire(self, group: str, run_id: str) -> set[str]:
        """Hold the group for `run_id` (it is no longer idle)."""
        return self._update(group, f"ADD holders :run REMOVE {IDLE}", run_id)

    def release(self, group: str, run_id: str) -> set[str]:
        """The runs that still hold the group after `run_id` let go."""
        return self._update(group, "DELETE holders :run", run_id)

    def mark_idle(self, group: str, *, now: float) -> None:
        self._db.update_item(
            TableName=self._table,
            Key=self._key(group),
            UpdateExpression=f"SET {IDLE} = :now",
            ExpressionAttributeValues={":now": {"N": str(now)}},
        )

    def idle_since(self, group: str) -> float | None:
        """When the last run let go of the group, if none holds it since (consistent read)."""
        value = self._item(group).get(IDLE, {}).get("N")
        return float(value) if value is not None else None

    def holders(self, group: str) -> set[str]:
        return set(self._item(group).get("holders", {}).get("SS", []))

    def _item(self, group: str) -> dict[str, Any]:
        answer = self._db.get_item(TableName=self._table, Key=self._key(group), ConsistentRead=True)
        return answer.get("Item", {})

    def _key(self, group: str) -> dict[str, Any]:
        return {LEASE_KEY: {"S": group}}

    def _update(self, group: str, expression: str, run_id: str) -> set[str]:
        answer = self._db.update_item(
            TableName=self._table,
            Key=self._key(group),
            UpdateExpression=expression,
            ExpressionAttributeValues={":run": {"SS": [run_id]}},
            ReturnValues="ALL_NEW",
        )
        return set(answer["Attributes"].get("holders", {}).get("SS", []))


class HyperPodCapacity:
    def __init__(
        self,
        sagemaker: Any,
        leases: CapacityLeases,
        *,
        cluster: str,
        instance_group: str,
        restricted: bool = False,
    ) -> None:
        self._sagemaker, self._leases = sagemaker, leases
        self.cluster, self.group = cluster, instance_group
        # The member of DescribeCluster's answer and UpdateCluster's request the group is in.
        self._member = "RestrictedInstanceGroups" if restricted else "InstanceGroups"
        update = sagemaker.meta.service_model.operation_model("UpdateCluster").input_shape
        self._group_shape = update.members[self._member].member

    @property
    def lease(self) -> str:
        return f"{self.cluster}/{self.group}"

    def scale_up(self, run_id: str, instances: int) -> int:
        """Hold the group for the run; make sure it asks for at least `instances` nodes."""
        with self._leases.locked(self.lease):
            self._leases.acquire(self.lease, run_id)
            groups = self._describe()
            current = self._group(groups)["TargetCount"]
            if current < instances:
                self._set_count(groups, instances)
        return max(current, instances)

    def ready_nodes(self) -> int:
        pages = self._sagemaker.get_paginator("list_cluster_nodes").paginate(
            ClusterName=self.cluster, InstanceGroupNameContains=self.group
        )
        return sum(
            1
            for page in pages
            for node in page["ClusterNodeSummaries"]
            if node["InstanceGroupName"] == self.group
            and node["InstanceStatus"]["Status"] == "Running"
        )

    def scale_down(self, run_id: str, *, now: float, keep_warm_seconds: float = 0) -> bool:
        """Let go of the group; scale it to zero when no other run holds it (after
        `keep_warm_seconds`, through `scale_idle`, when that is set). True if it did now."""
        with self._leases.locked(self.lease):
            if self._leases.release(self.lease, run_id):
                return False
            if keep_warm_seconds > 0:
                self._leases.mark_idle(self.lease, now=now)
                return False
            return self._to_zero()

    def scale_idle(self, *, keep_warm_seconds: float, now: float) -> bool:
        """Scale the group to zero if no run has held it for `keep_warm_seconds`. True if it did."""
        with self._leases.locked(self.lease):
            since = self._leases.idle_since(self.lease)
            if since is None or now - since < keep_warm_seconds:
                return False
            return self._to_zero()

    def scale_unheld(self) -> bool:
        """Scale the group to zero now if no run holds it, kept warm or not. True if it did."""
        with self._leases.locked(self.lease):
            if self._leases.holders(self.lease):
                return False
            return self._to_zero()

    def _to_zero(self) -> bool:
        groups = self._describe()
        if self._group(groups)["TargetCount"] == 0:
            return False
        self._set_count(groups, 0)
        return True

    def _describe(self) -> list[dict[str, Any]]:
        return self._sagemaker.describe_cluster(ClusterName=self.cluster).get(self._member, [])

    def _group(self, groups: list[dict[str, Any]]) -> dict[str, Any]:
        for group in groups:
            if group["InstanceGroupName"] == self.group:
                return group
        raise LookupError(f"HyperPod cluster {self.cluster} has no instance group {self.group!r}")

    def _set_count(self, described: list[dict[str, Any]], count: int) -> None:
        """UpdateCluster with every group of `described` (one DescribeCluster) as it is."""
        groups = []
        for group in described:
            spec = as_update(group, self._group_shape, leave_out=_UNCHANGED)
            if group["InstanceGroupName"] == self.group:
                spec["InstanceCount"] = count
            groups.append(spec)
        self._sagemaker.update_cluster(ClusterName=self.cluster, **{self._member: groups})


def as_update(
    described: dict[str, Any], shape: Any, *, leave_out: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """What UpdateCluster's `shape` (a botocore structure) takes of `described` (as
    DescribeCluster shows it): each member from the one of the same name, or the one it is
    called in DescribeCluster, or the desired value (else the current one) — so a group keeps
    the labels, taints and instance types last asked for."""
    spec: dict[str, Any] = {}
    for name, member in shape.members.items():
        if name in leave_out:
            continue
        for source in (name, _DESCRIBED_AS.get(name), f"Desired{name}", f"Current{name}"):
            if source in described:
                value = described[source]
                # Lists need no translation: their items have the same shapes in both
                # operations (tests/pipeline/test_hyperpod_capacity.py pins that on botocore).
                spec[name] = as_update(value, member) if member.type_name == "structure" else value
                break
    return spec
