#!/usr/bin/env bash
# The lab's model and its LoRA adapters, built on this machine (no hub) into the staging folder the lab's signed
# bundle carries to its mirror: models/lab/tiny-qwen2 (lab/scripts/build-tiny-model.py) and adapters/lab/tutor and
# adapters/lab/poet (lab/scripts/build-lora-adapter.py: rank 8, random non-zero weights, seeds 1 and 2), each with
# its SHA256SUMS. The same inputs give the same bytes.
#   lab/scripts/build-lab-models.sh STAGING_DIR
set -euo pipefail
cd "$(dirname "$0")/../.."
staging=${1:?usage: lab/scripts/build-lab-models.sh STAGING_DIR}
python=${VENV:-.venv}/bin/python
"$python" lab/scripts/build-tiny-model.py "$staging/models/lab/tiny-qwen2" >/dev/null
seed=1
for adapter in tutor poet; do
  "$python" lab/scripts/build-lora-adapter.py "$staging/models/lab/tiny-qwen2" "$staging/adapters/lab/$adapter" \
    --base lab/tiny-qwen2 --rank 8 --seed $seed >/dev/null
  seed=$((seed + 1))
done
