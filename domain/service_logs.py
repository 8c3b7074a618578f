"""Log groups AWS services write a deployment's clusters' logs to, under names the services
choose. The stacks create them first, so they have the deployment's retention and key and go
with the stack; `mtrl logs` reads the pods' lines from one of them.

Sources: the EKS User Guide, "Send control plane logs to CloudWatch Logs" (`/aws/eks/<cluster>/
cluster`); the CloudWatch User Guide, "Set up Fluent Bit as a DaemonSet to send logs to
CloudWatch Logs" (application, host and dataplane: Fluent Bit "creates the following log groups
if they don't already exist") and "Container Insights performance log reference" (the
performance groups of EKS, `/aws/containerinsights/<cluster>/performance`, and of ECS,
`/aws/ecs/containerinsights/<cluster>/performance`: Container Insights "automatically creates a
log group ... You don't need to create this log group yourself").
"""

from __future__ import annotations

# What Container Insights on EKS writes, one group each: pods' lines, the nodes' system logs,
# kubelet and container runtime, and the performance events its metrics come from.
EKS_CONTAINER_INSIGHTS = ("application", "host", "dataplane", "performance")


def eks_control_plane_group(cluster: str) -> str:
    return f"/aws/eks/{cluster}/cluster"


def eks_container_insights_group(cluster: str, kind: str) -> str:
    """The group of one of EKS_CONTAINER_INSIGHTS."""
    return f"/aws/containerinsights/{cluster}/{kind}"


def pod_log_group(cluster: str) -> str:
    """Where every pod's lines of an EKS cluster go (the CloudWatch observability add-on)."""
    return eks_container_insights_group(cluster, "application")


def ecs_container_insights_group(cluster: str) -> str:
    return f"/aws/ecs/containerinsights/{cluster}/performance"
