#!/usr/bin/env bash
# Fail loudly, with the fix, unless Podman runs with the netavark network backend under the project's
# containers.conf. Under CNI an --internal network's bridge has no IPv4 address on this machine, so the lab
# hosts cannot be reached and every packet for them leaves by the default route.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
fail() { printf 'podman network check: %s\n' "$*" >&2; exit 1; }
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
