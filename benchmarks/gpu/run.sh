#!/usr/bin/env bash
# Device-side entry point of the GPU harness (one line per device call; see docs/gpu-results.md):
#   benchmarks/gpu/run.sh stage            after carrying .gpu/part-NN and .gpu/SHA256SUMS: copy the part
#                                          into /tmp, print the host's GPU and Python (first call)
#   benchmarks/gpu/run.sh run N [ARGS]     install if needed, run the experiments not done yet (ARGS:
#                                          harness.py run options, e.g. --budget-s 540 --only NAME,NAME)
#   benchmarks/gpu/run.sh jit-cache save   pack the driver's JIT cache into $OUT/jit-cache.part-NN (last call;
#                                          `run` unpacks the one the plan names before its first start)
# Writes into $OUT (at most 4 files): stage.log, log-callN.txt, results-callN.json, raw-callN.tar.gz.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
case ${1:-} in
  stage)
    {
      date -u +%FT%TZ
      nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader 2>&1
      python3 --version; command -v xz || echo "no xz (python lzma used)"
      python3 benchmarks/gpu/harness.py stage
    } 2>&1 | tee -a "$OUT/stage.log"
    ;;
  run)
    call=${2:?call number}
    shift 2
    python3 benchmarks/gpu/harness.py run --call "$call" --out "$OUT" "$@" 2>&1 | tee "$OUT/log-call$call.txt"
    ;;
  jit-cache)
    [[ ${2:-} == save ]] || { echo "usage: $0 jit-cache save" >&2; exit 2; }
    python3 benchmarks/gpu/harness.py jit-cache-save --out "$OUT" 2>&1 | tee -a "$OUT/stage.log"
    ;;
  *)
    echo "usage: $0 stage | run N [harness.py run options] | jit-cache save" >&2
    exit 2
    ;;
esac
