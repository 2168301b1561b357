#!/usr/bin/env bash
# Which connection reaches the lab hosts faster: SSH with pipelining (the lab inventory's choice)
# or the podman connection. Runs the same 16-task playbook both ways against lab-1, 3 times each,
# and prints the median seconds. Needs the lab up (lab/scripts/lab.sh up).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
pb=$(mktemp --suffix=.yml); trap 'rm -f "$pb"' EXIT
{
  echo "- hosts: lab-1"
  echo "  gather_facts: false"
  echo "  tasks:"
  for i in $(seq 1 8); do
    echo "    - {name: stat $i, ansible.builtin.stat: {path: /etc/hostname}}"
    echo "    - {name: command $i, ansible.builtin.command: 'true', changed_when: false}"
  done
} >"$pb"
measure() {
  local times=() t
  for _ in 1 2 3; do
    t=$( { /usr/bin/time -f %e ansible-playbook -i lab/inventory "$pb" "$@" >/dev/null; } 2>&1 | tail -n 1)
    times+=("$t")
  done
  printf '%s\n' "${times[@]}" | sort -n | sed -n 2p
}
ssh_s=$(measure)
podman_s=$(measure -e ansible_connection=containers.podman.podman -e ansible_host=lab-1)
echo "16 tasks on lab-1, median of 3: ssh+pipelining ${ssh_s} s, podman connection ${podman_s} s"
