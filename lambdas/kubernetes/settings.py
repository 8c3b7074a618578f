"""The Kubernetes custom resources' settings: typed models over their functions' environment
(written by the stacks through `lambdas.environment.environment_for`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Self

from pydantic import BaseModel, ConfigDict, Field


class ClusterSettings(BaseModel):
    """Which EKS cluster a function talks to, and where."""

    model_config = ConfigDict(frozen=True)

    eks_cluster: str = Field(alias="EKS_CLUSTER")
    region: str = Field(alias="AWS_REGION")  # set by Lambda

    @classmethod
    def from_environment(cls, environment: Mapping[str, str]) -> Self:
        return cls.model_validate(dict(environment))


class RbacSettings(ClusterSettings):
    """The deploy-time RBAC bootstrap (lambdas/kubernetes/bootstrap.py)."""

    prefix: str = Field(alias="NAME_PREFIX")


class ChartSettings(ClusterSettings):
    """The HyperPod chart's installer (lambdas/kubernetes/chart_install.py)."""

    release: str = Field(alias="RELEASE")
