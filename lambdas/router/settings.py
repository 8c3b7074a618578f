"""The router functions' settings: one typed model over their environment (set by
stacks/components/router.py through `lambdas.environment.environment_for`)."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import Field

from lambdas.environment import EnvironmentSettings


class RouterSettings(EnvironmentSettings):
    table_name: str = Field(alias="TABLE_NAME")
    # How long the proxy waits for a generate response before answering "not yet".
    wait_seconds: float = Field(default=5.0, ge=0, alias="WAIT_SECONDS")
    # The deployment dimension of the router's metrics.
    deployment: str = Field(default="nova-mtrl", alias="NAME_PREFIX")


class ForwarderSettings(EnvironmentSettings):
    """The rollout forwarder's: the deployment's name prefix, which the run queues' names
    start with (domain/run_queues.py), and the conversation table, where it records each
    sample's phase."""

    name_prefix: str = Field(alias="NAME_PREFIX")
    table_name: str = Field(alias="TABLE_NAME")


def metrics_deployment(environment: Mapping[str, str]) -> str:
    """The metrics' deployment dimension, known before the rest is (the metrics are made as the
    entry module loads)."""
    field = RouterSettings.model_fields["deployment"]
    return environment.get(str(field.alias), str(field.default))
