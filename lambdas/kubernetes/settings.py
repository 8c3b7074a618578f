"""The Kubernetes custom resources' settings: typed models over their functions' environment
(written by the stacks through `lambdas.environment.environment_for`)."""

from __future__ import annotations

from pydantic import Field

from lambdas.environment import EnvironmentSettings


class ClusterSettings(EnvironmentSettings):
    """Which EKS cluster a function talks to, and where."""

    eks_cluster: str = Field(alias="EKS_CLUSTER")
    region: str = Field(alias="AWS_REGION")  # set by Lambda


class RbacSettings(ClusterSettings):
    """The deploy-time RBAC bootstrap (lambdas/kubernetes/bootstrap.py)."""

    prefix: str = Field(alias="NAME_PREFIX")


class ChartSettings(ClusterSettings):
    """The HyperPod chart's installer (lambdas/kubernetes/chart_install.py)."""

    release: str = Field(alias="RELEASE")
