# Sourced by the scripts in this folder: one place for the paths they share.
# Run `source scripts/env.sh` in a shell to use the project's venv and lab by hand.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# A shell that sourced another checkout's env.sh carries its paths: drop them, or this checkout's scripts would
# run that checkout's venv, cache and ansible.cfg (explicit VENV/CACHE_DIR for this checkout still count).
if [[ ${VLLM_FLEET_ROOT:-$ROOT} != "$ROOT" ]]; then
  unset VENV CACHE_DIR LAB_CGROUP_VOLUME
fi
export VLLM_FLEET_ROOT=$ROOT
export VENV=${VENV:-$ROOT/.venv}
export CACHE_DIR=${CACHE_DIR:-$ROOT/.cache}
export COLLECTIONS_DIR=$CACHE_DIR/collections
# The wheels `pip install .` of the library needs (scripts/bootstrap.sh; tests/unit/test_install.py installs from them).
export LIBRARY_WHEELS=$CACHE_DIR/library-wheels
# What a connected machine gathers for the site's mirror (wheelhouses, models, the apt repository): scripts/bundle.sh
# signs it into one bundle, and playbooks/bundle.yml verifies that and unpacks it onto the mirror ($CACHE_DIR/mirror
# in the lab, which lab-mirror serves). Nothing is served from here.
export STAGING_DIR=$CACHE_DIR/connected
export CONTAINERS_CONF=$CACHE_DIR/podman/containers.conf
export LAB_IMAGE=${LAB_IMAGE:-localhost/debian12-systemd}
export ANSIBLE_CONFIG=$ROOT/ansible.cfg
export PATH=$VENV/bin:$PATH
# The lab hosts' systemd must see cgroup v2 to know when a unit's processes are gone: on this machine kind
# (cgroup v1 with the v2 hierarchy mounted beside it, at /sys/fs/cgroup/unified) Podman gives a container
# only the v1 hierarchies, systemd there never learns that a stopped unit's cgroup is empty, and
# KillMode=control-group waits out TimeoutStopSec. With the v2 hierarchy bound in, systemd runs in hybrid
# mode and tracks processes there (lab/scripts/check-podman.sh checks it). A pure cgroup v2 host needs
# nothing: a harmless read-only bind of /dev/null stands in so that the container definitions stay the same.
if [[ $(stat -fc %T /sys/fs/cgroup/unified 2>/dev/null) == cgroup2fs && $(stat -fc %T /sys/fs/cgroup) != cgroup2fs ]]; then
  export LAB_CGROUP_VOLUME=${LAB_CGROUP_VOLUME:-/sys/fs/cgroup/unified:/sys/fs/cgroup/unified:rw}
else
  export LAB_CGROUP_VOLUME=${LAB_CGROUP_VOLUME:-/dev/null:/run/lab-no-cgroup-bind:ro}
fi
# Ansible compiles every filter plugin of plugins/filter (and the vllm_fleet modules they import) in each worker
# process of each task that uses a filter. With bytecode caches that is a read; without them (an environment that
# sets PYTHONDONTWRITEBYTECODE, as some CI images do) every task of every host compiles them again: playbooks/plan.yml
# over the fleet scenario's four hosts took 11.9 s with that variable set and 9.4 s without it (2026-12-05).
unset PYTHONDONTWRITEBYTECODE
