"""Phase 1: the network."""

from __future__ import annotations

from aws_cdk import aws_kms as kms
from constructs import Construct

from stacks.base import PlatformStack
from stacks.components.network import Network
from stacks.config import PlatformConfig


class NetworkStack(PlatformStack):
    def __init__(self, scope: Construct, *, config: PlatformConfig, log_key: kms.IKey) -> None:
        """`log_key`: the storage stack's, for the flow logs."""
        super().__init__(scope, "network", config=config, description="VPC, subnets, endpoints")
        self.network = Network(self, "Network", config=config, log_key=log_key)
