#!/usr/bin/env bash
# Build the lab/Molecule base image: Debian 12 (bookworm) with real systemd as PID 1, built with
# mmdebstrap from the machine's Debian mirror (no container registry is needed or reachable). mmdebstrap
# resolves and unpacks with apt in one pass: the image in 32 s, where debootstrap took 65 to 130 s
# (docs/benchmarks.md).
# Rebuilt only when the package list or the builder below changes (the image carries their hash as a label).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/env.sh

# python3-venv: the vllm role builds a virtualenv; libnuma1: vllm._C imports it on CPU; g++ and
# python3-dev: torch.compile builds its kernels at run time (inductor on CPU, Triton on GPUs);
# gnupg: repository keyrings in the driver role; the rest: systemd, sshd and Ansible's needs.
PACKAGES=systemd,systemd-sysv,dbus,python3,python3-apt,python3-venv,python3-dev,g++,openssh-server,iproute2,curl,ca-certificates,sudo,procps,libnuma1,gnupg,less
MIRROR=${DEBIAN_MIRROR:-$(awk '/^URIs:/ && $2 ~ /debian\/?$/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
BUILDER="mmdebstrap --variant=minbase --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr"
want=$(echo "$BUILDER $PACKAGES" | sha256sum | cut -c1-16)

if podman image exists "$LAB_IMAGE" &&
   [[ $(podman image inspect --format '{{ index .Labels "org.vllm-fleet.packages" }}' "$LAB_IMAGE") == "$want" ]]; then
  echo "image $LAB_IMAGE is current ($want)"; exit 0
fi

rootfs=$CACHE_DIR/image/rootfs
rm -rf "$rootfs"; mkdir -p "$rootfs"
echo "mmdebstrap bookworm from $MIRROR (about 30 s)"
# shellcheck disable=SC2086  # BUILDER is the command and its options, split on purpose
$BUILDER --include="$PACKAGES" bookworm "$rootfs" "$MIRROR" >"$CACHE_DIR/image/mmdebstrap.log" 2>&1 ||
  { tail -n 20 "$CACHE_DIR/image/mmdebstrap.log"; exit 1; }
# Each container gets its own machine ID and host name at start; keep the build machine's out of the image.
: >"$rootfs/etc/machine-id"
rm -f "$rootfs/etc/hostname"
# minbase has no /etc/hosts: without one, every name lookup waits ~20 s.
printf '127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n' >"$rootfs/etc/hosts"
# Containers have no console to log in on; keep the boot quiet and quick.
ln -sf /dev/null "$rootfs/etc/systemd/system/getty@tty1.service"
ln -sf /dev/null "$rootfs/etc/systemd/system/systemd-logind.service" || true
rm -f "$rootfs"/etc/ssh/ssh_host_*  # generated per container at first boot
mkdir -p "$rootfs/etc/systemd/system/ssh.service.d"
printf '[Service]\nExecStartPre=\nExecStartPre=/usr/bin/ssh-keygen -A\nExecStartPre=/usr/sbin/sshd -t\n' \
  >"$rootfs/etc/systemd/system/ssh.service.d/hostkeys.conf"
apt_lists=$rootfs/var/lib/apt/lists
rm -rf "$apt_lists"/* "$rootfs"/var/cache/apt/archives/*.deb
tar -C "$rootfs" -c . | podman import \
  --change 'CMD ["/sbin/init"]' --change 'STOPSIGNAL SIGRTMIN+3' \
  --change "LABEL org.vllm-fleet.packages=$want" - "$LAB_IMAGE" >/dev/null 2>&1
rm -rf "$rootfs"
echo "built $LAB_IMAGE ($want)"
