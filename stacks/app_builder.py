"""Builds the CDK app: reads the configuration, composes the stacks, adds the cdk-nag checks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from stacks.compute_stack import ComputeStack
from stacks.config import PlatformConfig, deployment_context
from stacks.network_stack import NetworkStack
from stacks.pipeline_stack import PipelineStack
from stacks.storage_stack import StorageStack


def build_app(
    context: Mapping[str, Any] | None = None, *, outdir: str | None = None
) -> tuple[cdk.App, PlatformConfig]:
    """The app with every stack, and the configuration it was built from (ConfigError if invalid)."""
    merged = deployment_context(context)
    config = PlatformConfig.from_context(merged)
    app = cdk.App(context=merged, outdir=outdir)
    # An existing VPC is only referenced, so it needs no stack of its own (an empty stack is
    # not a valid template); the compute stack imports it.
    storage = StorageStack(app, config=config)
    network = (
        None
        if config.existing_vpc
        else NetworkStack(app, config=config, log_key=storage.storage.data_key).network
    )
    compute = ComputeStack(app, config=config, network=network, storage=storage.storage)
    PipelineStack(
        app,
        config=config,
        storage=storage.storage,
        reward_fleet=compute.reward_fleet,
        hyperpod=compute.hyperpod,
        cluster_network=compute.eks.network,
    )
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app, config
