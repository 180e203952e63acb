#!/usr/bin/env bash
# Installs what the real node of the e2e suite (e2e/realnode.py) needs from Debian's archive:
# containerd and runc (not crun: it refuses the hybrid cgroup layout), the CNI plugins (bridge,
# host-local, loopback, portmap), iptables for kube-proxy, and a static busybox that the pod and
# sandbox images are made from (e2e/node_images.py). The kubelet and kube-proxy come from
# `e2e/tools/build.sh`. A no-op when everything is there; needs root (apt-get) otherwise.
#
# Usage: bash e2e/tools/install-node.sh
set -euo pipefail

PACKAGES=(containerd runc containernetworking-plugins iptables busybox-static)
have() {
  command -v containerd >/dev/null && command -v containerd-shim-runc-v2 >/dev/null &&
    command -v runc >/dev/null && command -v ctr >/dev/null && command -v iptables >/dev/null &&
    [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback &&
      -x /usr/lib/cni/portmap ]] &&
    dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'install ok installed'
}
if have; then
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "install-node.sh: needs Debian's apt-get to install ${PACKAGES[*]}" >&2
  exit 1
fi
if [[ $(id -u) != 0 ]]; then
  echo "install-node.sh: run as root to install ${PACKAGES[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# Debian's containerd package ships a systemd unit; nothing here starts it: the harness runs
# its own containerd with its own socket and directories.
apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}"
have || { echo "install-node.sh: installed, but something is still missing" >&2; exit 1; }
