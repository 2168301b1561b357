#!/usr/bin/env bash
# The lab's mirror, served from a bundle as an air-gapped site's is: the lab's own signing key (made here once,
# .cache/lab/bundle/, as the lab's apt key is), scripts/bundle.sh signs .cache/connected into .cache/bundles/lab.tar,
# then playbooks/bundle.yml (the lab inventory's vllm_mirrors: this machine's .cache/mirror, which lab-mirror serves)
# verifies the signature and every file and only then swaps the entries into place. Prints each step's time and size.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/env.sh
keys=$CACHE_DIR/lab/bundle
mkdir -p "$keys" "$CACHE_DIR/bundles" "$CACHE_DIR/mirror"
if [[ ! -f $keys/site.key ]]; then
  # Without a password (-W): the lab signs unattended; a site's key has one, and minisign asks for it.
  minisign -G -W -p "$keys/site.pub" -s "$keys/site.key" >/dev/null
fi
start=$SECONDS
# The lab bundles a checkout being worked on too: its HEAD, marked +changes (a site's bundle refuses that).
scripts/bundle.sh --secret-key "$keys/site.key" --out "$CACHE_DIR/bundles/lab.tar" --allow-dirty
echo "lab bundle: $(du -h "$CACHE_DIR/bundles/lab.tar" | cut -f1), built in $((SECONDS - start))s"
start=$SECONDS
ansible-playbook -i lab/inventory playbooks/bundle.yml
echo "lab bundle: verified and served from $CACHE_DIR/mirror in $((SECONDS - start))s"
