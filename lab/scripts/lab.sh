#!/usr/bin/env bash
# The main job on the embedded default, the lab (real systemd hosts on this machine serving a real
# vLLM on CPU):
#   lab/scripts/lab.sh up      set up the controller, build the wheelhouse, the tiny model and the apt repository,
#                          sign them into one bundle and serve it from the lab's mirror once verified, start
#                          the lab hosts, run `ansible-playbook site.yml` against them
#   lab/scripts/lab.sh down    remove the lab hosts, the mirror and the network
#   lab/scripts/lab.sh status  the lab containers and each host's service
# Extra arguments after `up` go to ansible-playbook (e.g. lab/scripts/lab.sh up --check --diff).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/env.sh
cmd=${1:-up}; shift || true
case $cmd in
  up)
    scripts/bootstrap.sh --no-image
    # The base image needs only Podman and the Debian mirror: build it while the wheelhouse and the model are
    # made. The package mirror holds what the image lacks, so it waits for the image.
    mkdir -p "$CACHE_DIR/image"
    lab/scripts/build-image.sh >"$CACHE_DIR/image/build.log" 2>&1 &
    image=$!
    scripts/wheelhouse.sh
    lab/scripts/build-lab-models.sh "$STAGING_DIR"
    wait "$image" || { cat "$CACHE_DIR/image/build.log" >&2; exit 1; }
    cat "$CACHE_DIR/image/build.log"
    "$VENV/bin/python" lab/scripts/apt-mirror.py
    # What the lab's mirror serves comes from one signed bundle, verified file by file first (playbooks/bundle.yml).
    lab/scripts/bundle.sh
    ansible-playbook -i lab/inventory lab/playbooks/lab.yml
    ansible-playbook -i lab/inventory site.yml "$@"
    gateway=$(awk '/vllm_gateway_vip:/ {sub("/.*", "", $2); print $2; exit}' lab/inventory/hosts.yml)
    cat <<EOT

The lab serves through its two gateways' virtual address (TLS with the lab's CA, a tenant's API key). Query it from
this machine:
  curl -s --cacert .cache/lab/pki/ca.crt https://$gateway/v1/chat/completions \\
    -H "Authorization: Bearer \$(cat .cache/lab/api-keys/lab-team-a)" -H 'Content-Type: application/json' \\
    -d '{"model": "tiny-qwen2", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 32}'
vLLM's own /metrics, from the lab network only (never through the gateway):
  curl -s http://$(awk '/ansible_host:/ {print $2; exit}' lab/inventory/hosts.yml):8000/metrics | grep '^vllm:'
Reports: reports/   Tear down: lab/scripts/lab.sh down
EOT
    ;;
  down)
    [[ -x $VENV/bin/ansible-playbook ]] || { echo "nothing to tear down (no venv)"; exit 0; }
    ansible-playbook -i lab/inventory lab/playbooks/lab.yml -e lab_state=absent
    ;;
  status)
    podman ps --all --filter network=vllm-lab --format '{{.Names}}\t{{.Status}}\t{{.Networks}}'
    ansible -i lab/inventory lab_nodes -m ansible.builtin.command -a "systemctl list-units 'vllm@*' --no-legend --no-pager" || true
    ;;
  *) echo "usage: $0 up|down|status [ansible-playbook args]" >&2; exit 2 ;;
esac
