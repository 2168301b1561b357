#!/usr/bin/env bash
# The GPU benchmark on a CUDA host (gpu/bench/README.md):
#   gpu/bench/run.sh run [N] [ARGS]     on the host: run the plan's experiments not done there yet
#                                            (ARGS: harness.py run options, e.g. --python /opt/vllm/bin/python,
#                                            --only NAME,NAME, --budget-s 540); N: the round (default: next)
#   gpu/bench/run.sh ssh HOST [ARGS]    from the controller: copy this checkout to HOST, run there,
#                                            copy the results back into $OUT
#   gpu/bench/run.sh stage              collect a bundle part copied into .gpu/ (parts.py), print the GPU
#   gpu/bench/run.sh jit-cache save     pack the driver's JIT cache into $OUT/jit-cache.part-NN
#   gpu/bench/run.sh answers-drift [ARGS]  on the host: issue 52, the fp8 KV cache's drift of the 4090 7B profile's
#                                            answers (answers_drift.py run; ARGS e.g. --budget-s 480); installs the
#                                            bundle as `run` does
# Writes into $OUT: log-roundN.txt, results-roundN.json, raw-roundN.tar.gz (and stage.log); answers-drift:
# answers-drift-{summary.json,measures.json,table.txt,servers.log,console.txt}.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
case ${1:-} in
  run)
    shift
    if [[ ${1:-} =~ ^[0-9]+$ ]]; then round=$1; shift; else round=$(python3 gpu/bench/harness.py next-round); fi
    python3 gpu/bench/harness.py run --round "$round" --out "$OUT" "$@" 2>&1 | tee "$OUT/log-round$round.txt"
    ;;
  ssh)
    host=${2:?usage: $0 ssh HOST [harness.py run options]}
    shift 2
    dir=${GPU_BENCH_DIR:-vllm-fleet-bench}
    rsync -a --delete --exclude .git --exclude .venv --exclude .cache ./ "$host:$dir/"
    # shellcheck disable=SC2029  # the options are quoted here, for the remote shell
    ssh "$host" "cd $dir && OUT=\$HOME/$dir-out bash gpu/bench/run.sh run $(printf '%q ' "$@")"
    rsync -a "$host:$dir-out/" "$OUT/"
    ;;
  stage)
    {
      date -u +%FT%TZ
      nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader 2>&1
      python3 --version; command -v xz || echo "no xz (python lzma used)"
      python3 gpu/bench/parts.py stage
    } 2>&1 | tee -a "$OUT/stage.log"
    ;;
  answers-drift)
    shift
    python3 gpu/bench/answers_drift.py run --out "$OUT" "$@" 2>&1 | tee "$OUT/answers-drift-console.txt"
    ;;
  jit-cache)
    [[ ${2:-} == save ]] || { echo "usage: $0 jit-cache save" >&2; exit 2; }
    python3 gpu/bench/harness.py jit-cache-save --out "$OUT" 2>&1 | tee -a "$OUT/stage.log"
    ;;
  *)
    echo "usage: $0 run [N] [harness.py run options] | ssh HOST [options] | stage | jit-cache save |" \
      "answers-drift [answers_drift.py run options]" >&2
    exit 2
    ;;
esac
