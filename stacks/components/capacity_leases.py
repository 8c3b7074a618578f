"""The training plane's capacity leases: which runs hold which HyperPod instance group, one item
per group (lambdas/pipeline/hyperpod_capacity.py). A table of its own, so the runs table holds
runs only."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from domain.needs import Need
from domain.tables import LEASE_KEY
from stacks.components.access import grant_table_action
from stacks.components.tables import data_table


class CapacityLeaseTable(Construct):
    """Attributes: `table`; provides the needs to take, return and read leases."""

    provides = frozenset({Need.CAPACITY_LEASES, Need.CAPACITY_LEASES_READ})

    def __init__(self, scope: Construct, construct_id: str, *, data_key: kms.IKey) -> None:
        super().__init__(scope, construct_id)
        self._data_key = data_key
        self.table = data_table(
            self,
            "Table",
            data_key=data_key,
            partition_key=LEASE_KEY,
            # Leases mean nothing once the pipeline that holds them is gone.
            removal_policy=RemovalPolicy.DESTROY,
        )

    def grant(self, need: Need, role: iam.IRole) -> None:
        writes = need is Need.CAPACITY_LEASES
        action = "dynamodb:UpdateItem" if writes else "dynamodb:GetItem"
        grant_table_action(role, action, self.table, self._data_key, writes=writes)
