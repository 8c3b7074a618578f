"""What every nova-mtrl stack shares: environment, pinned availability zones, tags."""

from __future__ import annotations

import aws_cdk as cdk
from constructs import Construct

from domain.naming import stack_name
from stacks.config import PlatformConfig


class PlatformStack(cdk.Stack):
    """A stack of the platform, named `<name_prefix>-<part>`."""

    def __init__(
        self, scope: Construct, part: str, *, config: PlatformConfig, description: str
    ) -> None:
        env = cdk.Environment(account=config.account, region=config.region)
        super().__init__(
            scope,
            stack_name(config.name_prefix, part),
            env=env if config.region or config.account else None,
            description=f"nova-mtrl {part}: {description}",
        )
        self.config = config
        cdk.Tags.of(self).add("nova-mtrl:deployment", config.name_prefix)

    @property
    def availability_zones(self) -> list[str]:
        # Never looked up at synth time: an environment-specific stack would otherwise ask AWS
        # (or the CLI's context cache) and fall back to dummy1a/dummy1b offline. Zones are
        # either the configured ones or chosen by CloudFormation at deploy time.
        zones = self.config.zones
        if zones is not None:
            return zones
        return [cdk.Fn.select(index, cdk.Fn.get_azs()) for index in range(self.config.az_count)]
