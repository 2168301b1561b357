#!/usr/bin/env bash
# Build, on the controller, the offline bundle that a GPU host without a package registry installs
# vLLM 0.26.0 and ansible-core from:
#   gpu/bench/build-bundle.sh
# 1. pip download (--no-deps, cp312 manylinux x86_64) every pin of gpu/bench/wheels.txt into
#    .gpu/wheels/<section>/ (kept: a second run downloads nothing);
# 2. bundle.py build: repack each wheel with stored members, tar, xz into .gpu/bundle.tar.xz, split it
#    into .gpu/part-NN of 48 MiB (parts.py), write .gpu/SHA256SUMS and .gpu/manifest.json (the original
#    wheels' sha256).
# 3. apt-get download (Debian 12's own packages, this controller's apt sources) the systemd that
#    gpu/host/site.sh runs as PID 1 of a namespace on a host that has none (gpu/host/namespace.sh) into
#    .gpu/systemd/ (about 5.4 MB; SYSTEMD_DEBS below lists them; needs a Debian 12 controller).
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
# systemd 252 and the libraries it links that an Ubuntu 24.04 GPU image lacks (seen on the H200 host, 2026-12-01).
SYSTEMD_DEBS=(systemd libsystemd-shared libkmod2 libcryptsetup12 libdevmapper1.02.1 libargon2-1 libjson-c5 libip4tc2
              libapparmor1 libseccomp2 libfdisk1)
. /etc/os-release
if [[ ${VERSION_CODENAME:-} != bookworm ]]; then
  echo "build-bundle.sh: the systemd for gpu/host/site.sh is Debian 12's; this controller is ${PRETTY_NAME:-unknown}." >&2
  echo "  Fix: run this on a Debian 12 controller, or put those packages' .debs (${SYSTEMD_DEBS[*]}) in .gpu/systemd/." >&2
  exit 1
fi
mkdir -p .gpu/systemd
(cd .gpu/systemd && apt-get download -q "${SYSTEMD_DEBS[@]}")
echo "bundle built in $((SECONDS - start)) s"
