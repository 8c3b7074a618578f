"""Phase 1: the network."""

from __future__ import annotations

from constructs import Construct

from stacks.base import PlatformStack
from stacks.components.network import Network
from stacks.config import PlatformConfig


class NetworkStack(PlatformStack):
    def __init__(self, scope: Construct, *, config: PlatformConfig) -> None:
        super().__init__(scope, "network", config=config, description="VPC, subnets, endpoints")
        self.network = Network(self, "Network", config=config)
