#!/usr/bin/env bash
# Set up everything the controller needs, idempotently, on a fresh Debian 12 machine:
#   1. apt packages (podman with the netavark network backend, runc, mmdebstrap, promtool, apt-utils and
#      gnupg for the lab's package mirror)
#   2. .venv: pinned ansible-core and tools (requirements/controller.txt) + this repo's vllm_fleet package, and the
#      wheels the package needs on its own ($LIBRARY_WHEELS: tests/unit/test_install.py installs it from them alone)
#   3. collections from requirements.yml (Galaxy, else the copies bundled in PyPI's `ansible` wheel)
#   4. the Podman configuration for this machine kind and the Debian 12 systemd base image
# Each phase is skipped when its result is already there. Usage: scripts/bootstrap.sh [--no-image]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=scripts/env.sh
source scripts/env.sh

phase() { printf '\n=== bootstrap: %s\n' "$*"; PHASE_START=$SECONDS; }
done_phase() { printf '=== bootstrap: done in %ss\n' "$((SECONDS - PHASE_START))"; }

# netavark + aardvark-dns: with --no-install-recommends podman brings the CNI backend, whose --internal
# network bridge gets no IPv4 address, so this machine has no route to the lab network. netavark 1.4 runs
# iptables for every network it sets up ("netavark: No such file or directory" without it).
# prometheus and prometheus-alertmanager: promtool and amtool check the monitoring configuration and rules;
# chromium: the report page's test opens it in a real headless browser.
# minisign: signs and verifies the air-gap bundle; nftables: the unit tests load the egress rules with the real nft
# (in a network namespace of their own).
APT_PACKAGES=(podman netavark aardvark-dns iptables runc mmdebstrap uidmap prometheus prometheus-alertmanager
  chromium apt-utils gnupg minisign nftables)
phase "apt packages: ${APT_PACKAGES[*]}"
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # prometheus and prometheus-alertmanager are only wanted for their checkers: their services stay off here.
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  systemctl disable --now prometheus prometheus-alertmanager >/dev/null 2>&1 || true
fi
done_phase

phase "controller venv ($VENV)"
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
if [[ ! -x $VENV/bin/python ]]; then
  "$PY" -m venv "$VENV"
fi
stamp=$VENV/.requirements.sha256
want=$(cat requirements/controller.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q -r requirements/controller.txt
  "$VENV/bin/pip" install -q --no-deps -e .
  echo "$want" >"$stamp"
fi
done_phase

# What `pip install .` needs, as wheels: pyproject.toml's build requirements and its dependencies (at controller.txt's
# pins where it pins them). tests/unit/test_install.py installs the package into a clean virtualenv from these alone
# (pip --no-index), so a dependency the library imports and pyproject.toml does not declare fails there.
phase "library wheels ($LIBRARY_WHEELS)"
stamp=$LIBRARY_WHEELS/.requirements.sha256
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  rm -rf "$LIBRARY_WHEELS"
  mapfile -t build_requires < <("$VENV/bin/python" -c \
    'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"], sep="\n")')
  "$VENV/bin/pip" download -q --only-binary=:all: -c requirements/controller.txt -d "$LIBRARY_WHEELS" \
    "${build_requires[@]}" .
  echo "$want" >"$stamp"
fi
done_phase

phase "collections ($COLLECTIONS_DIR)"
scripts/install-collections.sh
done_phase

phase "podman configuration and base image ($LAB_IMAGE)"
mkdir -p "$(dirname "$CONTAINERS_CONF")"
cp lab/scripts/containers.conf "$CONTAINERS_CONF"
# Podman fixes its network backend when it first runs: a machine whose podman already ran with CNI keeps it
# until `podman system reset`. Say so here rather than fail later with a lab that cannot be reached.
lab/scripts/check-podman.sh
if [[ ${1:-} != --no-image ]]; then
  lab/scripts/build-image.sh
fi
done_phase
