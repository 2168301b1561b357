#!/usr/bin/env bash
# One signed bundle of everything an air-gapped site's mirror serves, on a connected machine:
#   scripts/bundle.sh --secret-key site.key --out site-2026-12.tar [--allow-dirty]
# It carries this checkout's staging folder ($STAGING_DIR, .cache/connected: the wheelhouses of scripts/wheelhouse.sh,
# the models, the apt repository of the OS packages the gateway and monitoring hosts need), the collections of
# requirements.yml ($COLLECTIONS_DIR, as collections/) and this project at its HEAD (git archive, as project/), with
# a manifest of every file's SHA-256, a CycloneDX SBOM of the wheels, and the manifest's minisign signature made with
# the site's key (minisign -G -p site.pub -s site.key makes a pair; the site keeps site.pub). Refused: a checkout with
# uncommitted changes (the bundle carries a commit), a link or special file in the staging folder.
# On the site: ansible-playbook -i INVENTORY playbooks/bundle.yml -e vllm_bundle=/path/on/the/mirror/site-2026-12.tar
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/env.sh
source scripts/env.sh
[[ -d $STAGING_DIR ]] || { echo "bundle: $STAGING_DIR does not exist; fix: scripts/wheelhouse.sh first" >&2; exit 1; }
add=()
[[ -d $COLLECTIONS_DIR/ansible_collections ]] && add+=(--add "collections=$COLLECTIONS_DIR")
PYTHONPATH=$ROOT/src${PYTHONPATH:+:$PYTHONPATH} exec "$VENV/bin/python" -m vllm_fleet.bundle build \
  --staging "$STAGING_DIR" --project "$ROOT" "${add[@]}" "$@"
