#!/usr/bin/env bash
# A real systemd on a host whose PID 1 is not systemd (and which has none installed): Debian 12's
# systemd 252, unpacked from its .debs into /opt/sd, runs as PID 1 of a new PID + mount + cgroup
# namespace over the host's own root, with the host's devices (the GPUs) and cgroup v2 remounted.
#
#   namespace.sh boot DEB_DIR     unpack (once), boot, wait until systemd is up; prints its host PID
#   namespace.sh pid              the host PID of that systemd (empty when none runs)
#   namespace.sh exec CMD...      run CMD inside it (its mounts and PIDs) with systemctl, systemd-analyze
#                                 and journalctl on PATH
#   namespace.sh stop             end it (every process in it ends with it)
#
# Its own log goes to the kernel ring buffer (dmesg). Nothing outside /opt/sd, /etc/systemd/system, /run (a
# tmpfs of its own) and the three tools' wrappers in /usr/bin (where the host has none) is written by it.
set -uo pipefail
SD=/opt/sd
WRAP=$SD/wrap
PIDFILE=/var/tmp/gpu-host-systemd.pid
LDP=$SD/usr/lib/x86_64-linux-gnu:$SD/lib/x86_64-linux-gnu

pid() {
  local p
  p=$(cat "$PIDFILE" 2>/dev/null) || return 0
  [[ -n $p && -d /proc/$p && $(cat /proc/$p/comm 2>/dev/null) == systemd ]] && echo "$p"
}

nsexec() {
  local p
  p=$(pid)
  [[ -n $p ]] || { echo "namespace.sh: no systemd runs (boot it first)" >&2; return 3; }
  nsenter -t "$p" -m -p -- env PATH="$WRAP:$PATH" "$@"
}

unpack() {
  local debs=$1
  if [[ ! -x $SD/lib/systemd/systemd ]]; then
    mkdir -p "$SD"
    for f in "$debs"/*.deb; do dpkg -x "$f" "$SD"; done
  fi
  mkdir -p "$WRAP"
  # The tools find their own libraries (Debian 12's) first; nothing else on the host sees them.
  for tool in /bin/systemctl /bin/journalctl /usr/bin/systemd-analyze; do
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$LDP" "$SD$tool" >"$WRAP/${tool##*/}"
    chmod 755 "$WRAP/${tool##*/}"
    # Where a host with systemd has them (/usr/bin): a program that runs them with no PATH of its own (the
    # sentinel, whose environment is LC_ALL alone) finds them on Python's default search path (/bin:/usr/bin).
    [[ -e /usr/bin/${tool##*/} ]] || cp "$WRAP/${tool##*/}" "/usr/bin/${tool##*/}"
  done
  mkdir -p /etc/systemd/system
  cat >"$SD/boot.sh" <<BOOT
mount --make-rprivate /
mkdir -p /usr/lib/systemd /usr/lib/x86_64-linux-gnu/systemd
mount --bind $SD/lib/systemd /usr/lib/systemd
mount --bind $SD/usr/lib/x86_64-linux-gnu/systemd /usr/lib/x86_64-linux-gnu/systemd
mount -t tmpfs -o mode=755 tmpfs /run
# Runtime units of the namespace only (its /run): keep the host's /tmp and /var/tmp as they are (no
# boot-time cleaning by systemd-tmpfiles), and give journald the Debian libraries the host lacks (a
# service does not inherit PID 1's LD_LIBRARY_PATH; without them it exits 127 and no unit has a journal).
mkdir -p /run/systemd/system/systemd-journald.service.d
for unit in systemd-tmpfiles-setup.service systemd-tmpfiles-clean.timer systemd-tmpfiles-clean.service; do
  ln -sfn /dev/null /run/systemd/system/\$unit
done
printf '[Service]\nEnvironment=LD_LIBRARY_PATH=%s\n' "$LDP" >/run/systemd/system/systemd-journald.service.d/libraries.conf
# Without its own cgroup2 mount systemd stops: "Failed to create /init.scope control group".
umount /sys/fs/cgroup 2>/dev/null; mount -t cgroup2 cgroup2 /sys/fs/cgroup
export LD_LIBRARY_PATH=$LDP container=other
exec /usr/lib/systemd/systemd --system --log-target=kmsg --log-level=info
BOOT
}

boot() {
  local debs=${1:?DEB_DIR}
  unpack "$debs"
  if [[ -n $(pid) ]]; then pid; return 0; fi
  echo on >/proc/sys/kernel/printk_devkmsg 2>/dev/null || true
  setsid unshare --pid --fork --mount --mount-proc --cgroup bash "$SD/boot.sh" </dev/null >/var/tmp/gpu-host-systemd.log 2>&1 &
  local u=$! p="" state=""
  for _ in $(seq 1 100); do
    p=$(pgrep -P "$u" | head -n1)
    [[ -n $p ]] && break
    sleep 0.2
  done
  [[ -n $p ]] || { echo "namespace.sh: systemd did not start" >&2; cat /var/tmp/gpu-host-systemd.log >&2; return 1; }
  echo "$p" >"$PIDFILE"
  for _ in $(seq 1 60); do
    state=$(nsexec systemctl is-system-running 2>/dev/null)
    [[ $state == running || $state == degraded ]] && break
    sleep 0.5
  done
  echo "namespace.sh: systemd $p is $state" >&2
  echo "$p"
}

case ${1:-} in
  boot) shift; boot "$@" ;;
  pid) pid ;;
  exec) shift; nsexec "$@" ;;
  stop) p=$(pid); [[ -n $p ]] && kill -9 "$p"; rm -f "$PIDFILE" ;;
  *) echo "usage: $0 boot DEB_DIR | pid | exec CMD... | stop" >&2; exit 2 ;;
esac
