# Sourced by the scripts in this folder: one place for the paths they share.
# Run `source scripts/env.sh` in a shell to use the project's venv and lab by hand.
ROOT=${ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
export VENV=${VENV:-$ROOT/.venv}
export CACHE_DIR=${CACHE_DIR:-$ROOT/.cache}
export COLLECTIONS_DIR=$CACHE_DIR/collections
export CONTAINERS_CONF=$CACHE_DIR/podman/containers.conf
export LAB_IMAGE=${LAB_IMAGE:-localhost/debian12-systemd}
export ANSIBLE_CONFIG=$ROOT/ansible.cfg
export PATH=$VENV/bin:$PATH
