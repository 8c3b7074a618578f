#!/bin/bash
# HyperPod runs this once on every new node (EKS orchestrator) before the node joins the
# cluster. HyperPod itself installs the kubelet, the NVIDIA/EFA drivers and the health agents;
# this script only records the provisioning for `mtrl doctor` and support.
#
# Output goes to the node's log file and to stdout, which HyperPod ships to the cluster's
# CloudWatch log group: readable without a shell on the node (AWS's base lifecycle scripts,
# aws-samples/awsome-distributed-training, tee the same way).
set -euo pipefail

log_dir=${PROVISION_LOG_DIR:-/var/log/provision}
mkdir -p "$log_dir"
exec > >(tee -a "$log_dir/provisioning.log") 2>&1

echo "nova-mtrl on_create start $(date -Is) host=$(hostname)"
if [[ -d /opt/dlami/nvme ]]; then
  echo "instance storage: $(df -h /opt/dlami/nvme | tail -1)"
fi
if [[ -d /opt/sagemaker ]]; then
  echo "secondary EBS volume: $(df -h /opt/sagemaker | tail -1)"
fi
echo "nova-mtrl on_create done $(date -Is)"
