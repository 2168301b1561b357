#!/usr/bin/env bash
# Fail loudly, with the fix, unless Podman can run the lab: the netavark network backend under the project's
# containers.conf. Under CNI an --internal network's bridge has no IPv4 address on this machine, so the lab
# hosts cannot be reached and every packet for them leaves by the default route. And the cgroup v2 hierarchy
# that the lab hosts' systemd needs (see scripts/env.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/env.sh
fail() { printf 'podman check: %s\n' "$*" >&2; exit 1; }
command -v podman >/dev/null || fail "podman is not installed. Fix: scripts/bootstrap.sh (apt-get install podman netavark aardvark-dns)"
for p in netavark aardvark-dns iptables; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    fail "package $p is missing. Fix: apt-get install --no-install-recommends netavark aardvark-dns iptables"
done
[[ -f $CONTAINERS_CONF ]] || fail "$CONTAINERS_CONF is missing. Fix: scripts/bootstrap.sh"
backend=$(CONTAINERS_CONF=$CONTAINERS_CONF podman info --format '{{.Host.NetworkBackend}}' 2>/dev/null) ||
  fail "podman info failed. Fix: run 'podman info' to see why"
if [[ $backend != netavark ]]; then
  fail "podman uses the '$backend' network backend, not netavark, although $CONTAINERS_CONF selects netavark.
  Fix: export CONTAINERS_CONF=$CONTAINERS_CONF (source scripts/env.sh) before podman, or remove an override of
  network_backend in /etc/containers/containers.conf or ~/.config/containers/containers.conf"
fi
echo "podman network backend: $backend"
# The lab hosts' systemd needs the cgroup v2 hierarchy to see a stopped unit's processes gone (scripts/env.sh).
cg=$(stat -fc %T /sys/fs/cgroup)
if [[ $cg != cgroup2fs && $(stat -fc %T /sys/fs/cgroup/unified 2>/dev/null) != cgroup2fs ]]; then
  fail "this machine mounts cgroup v1 only (no cgroup2 at /sys/fs/cgroup/unified): systemd in the lab hosts could not
  tell when a unit's processes are gone, and every stop would wait out TimeoutStopSec or leave processes behind.
  Fix: boot with systemd.unified_cgroup_hierarchy=1 (cgroup v2), or mount it: mkdir -p /sys/fs/cgroup/unified && mount -t cgroup2 none /sys/fs/cgroup/unified"
fi
echo "lab hosts' cgroup bind: $LAB_CGROUP_VOLUME"
