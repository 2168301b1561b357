#!/usr/bin/env bash
# Install the collections of requirements.yml into $COLLECTIONS_DIR.
# Galaxy first (what an operator with Internet access gets); when Galaxy cannot be reached
# (air-gapped or this CI), take the same collections from PyPI's `ansible` wheel, which bundles
# them, and extract only those requirements.yml names. Skipped when all are present.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
ANSIBLE_BUNDLE=${ANSIBLE_BUNDLE:-ansible==12.3.0}
mapfile -t names < <(python3 - <<'PY'
import re
for line in open("requirements.yml"):
    m = re.match(r"\s*-\s*name:\s*(\S+)", line)
    if m:
        print(m.group(1))
PY
)
have_all=true
for n in "${names[@]}"; do
  [[ -f $COLLECTIONS_DIR/ansible_collections/${n/.//}/MANIFEST.json ]] || have_all=false
done
if $have_all; then echo "collections present: ${names[*]}"; exit 0; fi

mkdir -p "$COLLECTIONS_DIR"
if timeout 60 "$VENV/bin/ansible-galaxy" collection install -r requirements.yml -p "$COLLECTIONS_DIR" >/dev/null 2>&1; then
  echo "collections installed from Galaxy"; exit 0
fi
echo "Galaxy unreachable: extracting ${names[*]} from PyPI's $ANSIBLE_BUNDLE wheel"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$VENV/bin/pip" download -q --no-deps "$ANSIBLE_BUNDLE" -d "$tmp" 2>/dev/null
whl=$(ls "$tmp"/ansible-*.whl)
patterns=()
for n in "${names[@]}"; do patterns+=("ansible_collections/${n/.//}/*"); done
unzip -q -o "$whl" "${patterns[@]}" -d "$COLLECTIONS_DIR"
for n in "${names[@]}"; do
  v=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['collection_info']['version'])" \
      "$COLLECTIONS_DIR/ansible_collections/${n/.//}/MANIFEST.json")
  echo "  $n $v"
done
