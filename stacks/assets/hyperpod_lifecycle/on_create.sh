#!/bin/bash
# HyperPod runs this once on every new node (EKS orchestrator) before the node joins the
# cluster. HyperPod itself installs the kubelet, the NVIDIA/EFA drivers and the health agents;
# this script only records the provisioning in the node's log for `mtrl doctor` and support.
set -euo pipefail

log_dir=/var/log/provision
mkdir -p "$log_dir"
exec >>"$log_dir/provisioning.log" 2>&1

echo "nova-mtrl on_create start $(date -Is) host=$(hostname)"
if [[ -d /opt/dlami/nvme ]]; then
  echo "instance storage: $(df -h /opt/dlami/nvme | tail -1)"
fi
echo "nova-mtrl on_create done $(date -Is)"
