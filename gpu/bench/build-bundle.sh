#!/usr/bin/env bash
# Build, on the controller, the offline bundle that a GPU host without a package registry installs
# vLLM 0.26.0 and ansible-core from:
#   gpu/bench/build-bundle.sh
# 1. pip download (--no-deps, cp312 manylinux x86_64) every pin of gpu/bench/wheels.txt into
#    .gpu/wheels/<section>/ (kept: a second run downloads nothing);
# 2. bundle.py build: repack each wheel with stored members, tar, xz into .gpu/bundle.tar.xz, split it
#    into .gpu/part-NN of 48 MiB (parts.py), write .gpu/SHA256SUMS and .gpu/manifest.json (the original
#    wheels' sha256).
# .gpu/ is git-ignored. Copy .gpu/ to the host whole, or part by part (run.sh stage).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/env.sh
PINS=gpu/bench/wheels.txt
PLATFORMS=(manylinux_2_39_x86_64 manylinux_2_35_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64
           manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64
           manylinux2014_x86_64 manylinux1_x86_64)
P=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp)
for p in "${PLATFORMS[@]}"; do P+=(--platform "$p"); done
start=$SECONDS
section=""
declare -A want
while IFS= read -r line; do
  line=${line%%#*}; line=${line//[[:space:]]/}
  [[ -z $line ]] && continue
  if [[ $line == \[*\] ]]; then section=${line:1:-1}; continue; fi
  want[$section]+="$line "
done <"$PINS"
for section in "${!want[@]}"; do
  dir=.gpu/wheels/$section
  mkdir -p "$dir"
  # shellcheck disable=SC2086
  python -m pip download -q "${P[@]}" -d "$dir" ${want[$section]} \
    2> >(grep -v "is ignored: it is neither" >&2)
done
python gpu/bench/bundle.py build --wheels .gpu/wheels --pins "$PINS" --out .gpu
echo "bundle built in $((SECONDS - start)) s"
