#!/usr/bin/env bash
# Run the nvidia_driver role's detection and verification for real on a GPU host that has no package
# registry (an H200 host: Ubuntu 24.04, driver 580 loaded, Python 3.12), from a checkout of this repo.
#
#   gpu/host/driver-check.sh [EXPECTED_GPU]        (default H200)
#
# Needs ansible-core and its dependencies as wheels in .whl/ (see "Wheels" below; .whl/ is git-ignored).
# Installs them into $SITE (default /tmp/site), runs playbooks/nvidia_driver_check.yml against this
# machine (connection local, host in gpu_nodes only, nvidia_driver_expected_gpu=EXPECTED_GPU,
# vllm_version=$VLLM_VERSION), then runs it once more expecting an L40 to show that verification refuses
# the wrong card. Writes to $OUT (default ./.gpu-check-out), at most 6 files:
#   check.log                 the ansible-playbook output of the real check
#   expect-l40.log            the output of the run that must fail
#   nvidia_driver_check-gpu-host.json   the facts the role set (UUIDs masked)
#   query-gpu-nounits.csv     the raw nvidia-smi query the module parses (UUIDs masked)
#   host.txt                  OS, kernel, driver files, Secure Boot tools seen
#   summary.txt               one line per run: what was expected and what happened
# Exit status: 0 when the check passed and the L40 run failed as it should.
#
# Wheels (on a machine with PyPI, from the repo root; about 8.3 MiB):
#   P="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
#      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl"
#   for w in ansible-core==2.19.14 jinja2==3.1.6 markupsafe==3.0.4 pyyaml==6.0.4 cryptography==50.0.2 \
#            cffi==2.1.1 pycparser==3.12 packaging==26.4 resolvelib==1.2.1; do pip download $P $w; done
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
EXPECTED_GPU=${1:-H200}
VLLM_VERSION=${VLLM_VERSION:-0.33.0}
SITE=${SITE:-/tmp/site}
OUT=${OUT:-$ROOT/.gpu-check-out}
WORK=$(mktemp -d /tmp/nvd-check.XXXXXX)
mkdir -p "$OUT"
PYTHON=$(command -v python3)
# Where the driver ships nvidia-smi: on PATH, or a driver container's /usr/local/nvidia/bin.
NVSMI=$(command -v nvidia-smi || { [ -x /usr/local/nvidia/bin/nvidia-smi ] && echo /usr/local/nvidia/bin/nvidia-smi; } || echo nvidia-smi)

if [ ! -x "$SITE/bin/ansible-playbook" ]; then
  ls .whl/*.whl >/dev/null 2>&1 || { echo "no wheels in .whl/ (see the header of $0)" >&2; exit 2; }
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
fi
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
# Ansible refuses a non-UTF-8 locale; the module itself runs nvidia-smi with LC_ALL=C.
export LC_ALL=C.UTF-8 LANG=C.UTF-8 PYTHONUNBUFFERED=1

# A configuration of its own: the repo's ansible.cfg names collections this host does not have.
cat >"$WORK/ansible.cfg" <<CFG
[defaults]
collections_path = $ROOT/collections
stdout_callback = ansible.builtin.default
callback_result_format = yaml
host_key_checking = false
retry_files_enabled = false
local_tmp = $WORK/tmp
nocolor = true
CFG
cat >"$WORK/inventory.yml" <<INV
all:
  children:
    gpu_nodes:
      hosts:
        gpu-host:
          ansible_connection: local
          ansible_python_interpreter: $PYTHON
INV
export ANSIBLE_CONFIG=$WORK/ansible.cfg

{
  echo "# $(date -u +%FT%TZ)"
  grep -E '^(PRETTY_NAME|VERSION_ID)=' /etc/os-release || true
  echo "kernel: $(uname -r)"
  echo "python: $("$PYTHON" --version 2>&1)"
  echo "ansible-core: $("$PYTHON" -c 'import ansible.release as r; print(r.__version__)')"
  echo "nvidia-smi: $NVSMI"
  echo "/proc/driver/nvidia/version: $(head -n1 /proc/driver/nvidia/version 2>/dev/null || echo absent)"
  echo "/sys/module/nvidia: $([ -d /sys/module/nvidia ] && echo present || echo absent)"
  echo "mokutil: $(command -v mokutil || echo none); EFI: $([ -d /sys/firmware/efi ] && echo yes || echo no)"
  echo "systemd PID 1: $([ "$(cat /proc/1/comm 2>/dev/null)" = systemd ] && echo yes || echo no)"
} >"$OUT/host.txt" 2>&1
LC_ALL=C "$NVSMI" --query-gpu=index,uuid,name,memory.total,memory.used,driver_version,compute_cap,pci.bus_id,persistence_mode \
  --format=csv,noheader,nounits 2>&1 | sed -E 's/GPU-[0-9a-fA-F-]+/GPU-00000000-0000-0000-0000-000000000000/g' \
  >"$OUT/query-gpu-nounits.csv" || true

playbook() {
  "$PYTHON" "$SITE/bin/ansible-playbook" -i "$WORK/inventory.yml" "$ROOT/playbooks/nvidia_driver_check.yml" \
    -e "vllm_version=$VLLM_VERSION" "$@"
}

set +e
playbook -e "nvidia_driver_expected_gpu=$EXPECTED_GPU" -e nvidia_driver_check_report_dir="$OUT" >"$OUT/check.log" 2>&1
check_rc=$?
playbook -e nvidia_driver_expected_gpu=L40 >"$OUT/expect-l40.log" 2>&1
l40_rc=$?
set -e

{
  echo "check (expect $EXPECTED_GPU, vLLM $VLLM_VERSION): rc=$check_rc ($([ $check_rc = 0 ] && echo passed || echo FAILED))"
  echo "negative check (expect L40 on this host): rc=$l40_rc ($([ $l40_rc != 0 ] && grep -q 'expected to have L40' "$OUT/expect-l40.log" \
    && echo 'refused as it should' || echo 'NOT refused: verification is broken'))"
} | tee "$OUT/summary.txt"
# Identifiers stay on the host: mask every GPU UUID in what comes back (some facts carry them unmasked).
sed -i -E 's/GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/GPU-00000000-0000-0000-0000-000000000000/g' "$OUT"/*
tail -n 25 "$OUT/check.log"
rm -rf "$WORK"
[ $check_rc = 0 ] && [ $l40_rc != 0 ] && grep -q 'expected to have L40' "$OUT/expect-l40.log"
