#!/usr/bin/env bash
# site.yml, unmodified, on an H200 host that is its own controller (inventories/gpu-host), under a real
# systemd (namespace.sh), with what such a host lacks replaced and nothing else: the wheels come from a
# local wheelhouse (no package registry there), the weights are dummy ones with the catalogue's
# dimensions (no model hub). docs/gpu-host-site.md has the results.
#
#   scripts/gpu-host/site.sh probe          read what the host has (Python, venv, apt, devices), boot
#                                           systemd, run the nvidia_driver role under it (needs the
#                                           ansible wheels in .gpu/wheels/ansible and .gpu/systemd/*.deb)
#   scripts/gpu-host/site.sh stage          copy a bundle part (.gpu/part-NN) into /tmp/gpu-bundle
#   scripts/gpu-host/site.sh run [BUDGET]   run, in order, the steps not yet done on this host while they
#                                           fit in BUDGET seconds (default: all of them); run it again
#                                           to go on. Steps:
#     prepare      join and check the bundle (benchmarks/gpu/build-bundle.sh), ansible-core, the
#                  wheelhouse, the dummy model, boot systemd
#     site1        site.yml: plan, driver, install, stage, unit, start, health, verify, release 1
#     wrong        playbooks/verify.yml expecting an fp8 KV cache: must fail
#     restart      systemctl restart with 4 streams in flight (no drain backstop): time to healthy
#     site2        site.yml with a changed profile and --shutdown-timeout 20: the rollout's restart, release 2
#     drain        systemctl restart with 4 streams in flight, with the backstop
#     bare         the unit's exact command and environment started outside systemd (no sandbox), then
#                  the unit started again: time to healthy without and with the sandbox
#     site3        site.yml with a change that fails at start: the rollout restores release 2
# Writes into $OUT (default .gpu-site-out): summary.txt and logs.tar.gz (every log, the unit, its
# security report, the reports/ folder, the journal), refreshed after every step.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
OUT=${OUT:-$ROOT/.gpu-site-out}
WORK=/var/tmp/gpu-host-site
LOGS=$WORK/logs
ASITE=$WORK/ansible
NS=$ROOT/scripts/gpu-host/namespace.sh
# The files brought to the host (bundle parts, the systemd .debs, the ansible wheels) and ansible.posix (its
# task timer): in this checkout, or in another one that holds them (GPU_HOST_FILES, GPU_HOST_COLLECTIONS).
GPU=${GPU_HOST_FILES:-$ROOT/.gpu}
COLLECTIONS=${GPU_HOST_COLLECTIONS:-$ROOT/.cache/collections}
PY=$(command -v python3)
MODEL_ID=Qwen/Qwen2.5-7B-Instruct
UNIT=vllm@main.service
URL=http://127.0.0.1:8000
WHEELHOUSE=/opt/vllm-site/wheelhouse/vllm-0.26.0-cp312
EXTRA_BASE='"load_format": "dummy", "tokenizer": "/var/lib/vllm/models/Qwen--Qwen2.5-7B-Instruct/tokenizer"'
ENV_BASE='"VLLM_USE_FLASHINFER_SAMPLER": "0", "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"'
# The change of site2 (and of site3, which adds a fault to it).
CHANGE2="{\"vllm_profile\": {\"max_num_seqs\": 32}, \"vllm_extra_args\": {$EXTRA_BASE, \"shutdown_timeout\": 20}}"
CHANGE3="{\"vllm_profile\": {\"max_num_seqs\": 32}, \"vllm_extra_args\": {$EXTRA_BASE, \"shutdown_timeout\": 20},
 \"vllm_environment\": {$ENV_BASE, \"CUDA_VISIBLE_DEVICES\": \"7\"}}"
STEPS=(prepare site1 wrong restart site2 drain bare site3)
# Seconds each step may take, from the runs so far (a step starts only if its cost still fits the budget).
declare -A COST=([prepare]=60 [site1]=260 [wrong]=25 [restart]=130 [site2]=190 [drain]=100 [bare]=170 [site3]=200)
mkdir -p "$OUT" "$LOGS" "$WORK/done"
export LC_ALL=C.UTF-8 LANG=C.UTF-8 PYTHONUNBUFFERED=1

say() { echo "[$(date -u +%T)] $*" | tee -a "$OUT/summary.txt" "$LOGS/summary.txt" >&2; }
now() { date +%s.%N; }
secs() { "$PY" -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$2"; }
sysctl_() { "$NS" exec systemctl --no-pager "$@"; }

# ansible-playbook / ansible inside the namespace, from the bundle's ansible-core, with this checkout's
# vllm_fleet (src/) importable by the filter plugins, as `pip install -e .` makes it on a controller; not on
# PYTHONPATH, so that nothing of it leaks into the commands and the service the run starts.
ansible_cli() {
  local cli=$1; shift
  "$NS" exec env ANSIBLE_CONFIG="$WORK/ansible.cfg" LC_ALL=C.UTF-8 LANG=C.UTF-8 PYTHONUNBUFFERED=1 "$PY" -c \
    "import sys; sys.path[:0] = [sys.argv.pop(1), sys.argv.pop(1)]; sys.argv[0] = 'ansible-$cli'
from ansible.cli.$cli import main; sys.exit(main())" "$ASITE" "$ROOT/src" "$@"
}
ap() { ansible_cli playbook -i "$ROOT/inventories/gpu-host" "$@"; }
# Tags to skip, none by default (GPU_HOST_SKIP_TAGS=a,b): the driver role's hold lists the installed packages
# with dpkg-query, which needs no python3-apt (this image has none), so nothing of site.yml is skipped.
SITE_SKIP=()
[[ -n ${GPU_HOST_SKIP_TAGS:-} ]] && SITE_SKIP=(--skip-tags "$GPU_HOST_SKIP_TAGS")

health_wait() {  # seconds until /health answers 200 (or "timeout")
  local t0 limit=${1:-600}
  t0=$(now)
  while :; do
    if "$PY" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "$URL/health" 2>/dev/null; then
      secs "$t0" "$(now)"; return 0
    fi
    (( $(printf '%.0f' "$(secs "$t0" "$(now)")") > limit )) && { echo timeout; return 1; }
    sleep 0.5
  done
}

gpu_free() {  # wait until the GPU's memory is back (the engine core ends after the API server)
  local _
  for _ in $(seq 1 60); do
    (( $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -n1) < 2048 )) && return 0
    sleep 1
  done
}

pack() {
  local d=$LOGS/state
  mkdir -p "$d"
  if [[ -n $("$NS" pid) ]]; then
    sysctl_ cat "$UNIT" >"$d/unit.txt" 2>&1
    sysctl_ show "$UNIT" >"$d/unit-show.txt" 2>&1
    "$NS" exec journalctl --no-pager -o short-precise -u "$UNIT" >"$d/journal.txt" 2>&1
    sysctl_ list-units --failed --no-legend >"$d/failed-units.txt" 2>&1
  fi
  ls -la /etc/vllm /etc/vllm/releases/main >"$d/etc-vllm.txt" 2>&1
  cp -r "$ROOT/reports" "$d/" 2>/dev/null
  dmesg 2>/dev/null | grep -E "systemd\[1\]|vllm" | tail -n 300 >"$d/dmesg.txt"
  # GPU identifiers stay on the host.
  find "$LOGS" -type f -size -20M -exec sed -i -E \
    's/GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/GPU-00000000-0000-0000-0000-000000000000/g' {} +
  tar -czf "$OUT/logs.tar.gz" -C "$WORK" logs
}

# --- the host, read only, then systemd and the driver role -------------------------------------
probe() {
  {
    echo "## host"; date -u +%FT%TZ; pwd; id; grep -E '^(PRETTY_NAME)=' /etc/os-release; uname -r; nproc; free -g | head -2
    df -h / /tmp /var/tmp /opt 2>&1 | sort -u
    echo "## python"; command -v python3; readlink -f "$(command -v python3)"; cat /opt/torch/.venv/pyvenv.cfg 2>&1
    ls -l /usr/bin/python3* 2>&1
    for p in /usr/bin/python3 /opt/torch/.venv/bin/python3; do
      echo "-- $p"; "$p" -c 'import sys; print(sys.version.split()[0], sys.prefix, sys.base_prefix)' 2>&1
      "$p" -c 'import ensurepip; print("ensurepip ok")' 2>&1 | tail -1
      "$p" -c 'import apt; print("python3-apt ok")' 2>&1 | tail -1
      "$p" -m pip --version 2>&1 | tail -1
      "$p" -c 'import torch; print("torch", torch.__version__, torch.__file__)' 2>&1 | tail -1
    done
    rm -rf /var/tmp/probe-venv*; /usr/bin/python3 -m venv /var/tmp/probe-venv 2>&1 | tail -2; echo "venv with pip rc=$?"
    ls /var/tmp/probe-venv/bin 2>&1 | tr '\n' ' '; echo
    /usr/bin/python3 -m venv --without-pip /var/tmp/probe-venv2 2>&1 | tail -2; ls /var/tmp/probe-venv2/bin 2>&1 | tr '\n' ' '; echo
    echo "## packages"; dpkg-query -W -f '${Package} ${Version} ${Status}\n' python3-venv python3.12-venv python3-dev python3.12-dev \
      gcc g++ libnuma1 python3-apt sudo initramfs-tools systemd util-linux 2>&1
    dpkg-query -W -f '${Package}\n' 2>/dev/null | grep -iE 'nvidia|cuda' | head -20
    for c in update-initramfs setpriv useradd groupadd sudo nvidia-modprobe nvidia-smi gcc curl dpkg apt-get; do
      echo "$c: $(command -v $c || echo none)"; done
    echo "## devices"; ls -l /dev/nvidia* 2>&1; ls /dev/nvidia-caps 2>&1
    mount | grep -E 'cgroup|/tmp|/run ' ; ls /usr/lib/tmpfiles.d /etc/tmpfiles.d 2>&1 | head; ls /usr/lib/systemd 2>&1 | head -5
    cat /proc/driver/nvidia/version 2>&1 | head -2
  } >"$LOGS/probe-host.txt" 2>&1
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$ASITE" "$GPU"/wheels/ansible/*.whl \
    >"$LOGS/probe-pip.txt" 2>&1
  "$PY" scripts/gpu-host/prepare.py ansible-cfg --to "$WORK/ansible.cfg" --work "$WORK" --collections "$COLLECTIONS"
  local t0; t0=$(now)
  "$NS" boot "$GPU/systemd" >"$LOGS/probe-boot.txt" 2>&1
  say "probe: systemd booted in $(secs "$t0" "$(now)") s: $(tail -n2 "$LOGS/probe-boot.txt" | tr '\n' ' ')"
  {
    sysctl_ is-system-running; sysctl_ list-units --failed --no-legend
    cat >/etc/systemd/system/probe-journal.service <<'UNIT'
[Service]
Type=oneshot
ExecStart=/bin/echo probe-journal-line
StandardOutput=journal
DevicePolicy=closed
DeviceAllow=/dev/nvidia-modeset rw
DeviceAllow=/dev/nvidiactl rw
UNIT
    "$NS" exec systemd-analyze verify /etc/systemd/system/probe-journal.service; echo "verify rc=$?"
    sysctl_ daemon-reload; sysctl_ start probe-journal.service; echo "start rc=$?"
    sleep 1; "$NS" exec journalctl --no-pager -u probe-journal.service; echo "journalctl rc=$?"
    sysctl_ status systemd-journald.service | head -5
    # A release venv that sees the image's torch through a .pth (what vllm_venv_site_packages writes), CUDA
    # under the unit's hardening as an unprivileged user, its output in the journal.
    rm -rf /opt/probe-venv; python3 -m venv /opt/probe-venv
    echo 'import site; site.addsitedir("/opt/torch/.venv/lib/python3.12/site-packages")' \
      >"$(/opt/probe-venv/bin/python -c "import sysconfig; print(sysconfig.get_path('purelib'))")/zz-probe.pth"
    cat >/etc/systemd/system/probe-cuda.service <<'UNIT'
[Service]
Type=oneshot
User=nobody
Environment=HOME=/var/tmp TRITON_CACHE_DIR=/var/tmp/probe-triton
ExecStart=/opt/probe-venv/bin/python -c "import sys, torch; x = torch.ones(1024, 1024, device='cuda'); print('cuda ok', sys.prefix, torch.__file__, (x @ x).sum().item(), open('/proc/self/status').read().split('NoNewPrivs:')[1].split()[0])"
StandardOutput=journal
StandardError=journal
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
CapabilityBoundingSet=
SystemCallFilter=@system-service
SystemCallErrorNumber=EPERM
DevicePolicy=closed
DeviceAllow=/dev/nvidiactl rw
DeviceAllow=/dev/nvidia-uvm rw
DeviceAllow=/dev/nvidia-uvm-tools rw
DeviceAllow=/dev/nvidia-modeset rw
DeviceAllow=/dev/nvidia0 rw
UNIT
    sysctl_ daemon-reload; sysctl_ start probe-cuda.service; echo "probe-cuda rc=$?"
    sleep 1; "$NS" exec journalctl --no-pager -o cat -u probe-cuda.service | tail -n 8
  } >"$LOGS/probe-systemd.txt" 2>&1
  cat >"$WORK/probe.yml" <<'PLAY'
- name: The nvidia_driver role as site.yml runs it
  hosts: gpu_nodes
  become: true
  gather_facts: true
  roles:
    - role: nvidia_driver
  post_tasks:
    - name: Facts site.yml relies on
      ansible.builtin.debug:
        msg: "{{ ansible_facts['service_mgr'] }} {{ ansible_facts['distribution'] }} {{ ansible_facts['distribution_version'] }} {{ ansible_facts['pkg_mgr'] }}"
PLAY
  t0=$(now)
  ap "$WORK/probe.yml" "${SITE_SKIP[@]}" -e vllm_version=0.26.0 >"$LOGS/probe-driver.txt" 2>&1
  say "probe: nvidia_driver role under systemd rc=$? in $(secs "$t0" "$(now)") s: $(grep -A2 'PLAY RECAP' "$LOGS/probe-driver.txt" | tail -n1)"
  "$NS" stop
  cp "$LOGS"/probe-*.txt "$OUT/"
  pack
}

# --- the steps --------------------------------------------------------------------------------
limits() {  # the open-files limit along the way: host shell, systemd in the namespace, a process ($1: PID)
  local sd; sd=$("$NS" pid)
  echo "fs.nr_open $(cat /proc/sys/fs/nr_open) fs.file-max $(cat /proc/sys/fs/file-max)"
  echo "this shell: soft $(ulimit -Sn) hard $(ulimit -Hn); $(grep -E '^Cap(Eff|Bnd)' /proc/self/status | tr '\n\t' '  ')"
  echo "raising the hard limit as root: $(bash -c 'ulimit -Hn 65536 2>&1 && echo "to $(ulimit -Hn): ok"')"
  echo "PID 1 of the host ($(cat /proc/1/comm)): $(grep 'Max open files' /proc/1/limits)"
  [[ -n $sd ]] && echo "systemd in the namespace (host PID $sd): $(grep 'Max open files' "/proc/$sd/limits"); $(grep -E '^CapEff' "/proc/$sd/status" | tr '\t' ' ')"
  [[ -n ${1:-} ]] && echo "process $1 ($(cat "/proc/$1/comm" 2>/dev/null)): $(grep 'Max open files' "/proc/$1/limits" 2>/dev/null)"
  dmesg 2>/dev/null | grep -iE 'systemd\[1\].*(rlimit|nr_open|file-max|bump)' | tail -n 5
  return 0
}

step_prepare() {
  if [[ ! -f $WORK/bundle.done ]]; then
    "$PY" benchmarks/gpu/bundle.py assemble --parts /tmp/gpu-bundle/parts --parts "$GPU" --sums "$GPU/SHA256SUMS" \
      --to "$WORK/bundle" || return 1
    touch "$WORK/bundle.done"
  fi
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$ASITE" "$WORK"/bundle/wheels/ansible/*.whl || return 1
  "$PY" scripts/gpu-host/prepare.py wheelhouse --wheels "$WORK/bundle/wheels/vllm" --to "$WHEELHOUSE" || return 1
  "$PY" scripts/gpu-host/prepare.py model --id "$MODEL_ID" --to /opt/vllm-site/models || return 1
  "$PY" scripts/gpu-host/prepare.py ansible-cfg --to "$WORK/ansible.cfg" --work "$WORK" --collections "$COLLECTIONS" || return 1
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader
  # The role's own pattern (roles/nvidia_driver/vars/main.yml), so that this list is what the hold holds.
  local hold; hold=$(grep -A1 '^_nvidia_driver_hold_pattern:' roles/nvidia_driver/vars/main.yml | tail -n1 | tr -d ' ')
  echo "driver packages the hold would hold: $(dpkg-query -W -f '${Package}\n' | grep -E "$hold" | tr '\n' ' ')"
  "$NS" boot "$GPU/systemd" || return 1
  limits >"$LOGS/limits.txt" 2>&1
}

ensure_up() {  # systemd running (boot it again if it has ended since the last run) and the service healthy
  [[ -f /etc/systemd/system/$UNIT ]] || { say "no $UNIT installed (site1 did not get that far)"; return 1; }
  if [[ -z $("$NS" pid) ]]; then
    "$NS" boot "$GPU/systemd" || return 1
    say "systemd booted again; $UNIT (enabled) starting: healthy after $(health_wait 400) s"
  fi
  health_wait 400 >/dev/null
}

step_site1() {
  ap "$ROOT/site.yml" "${SITE_SKIP[@]}" -e vllm_verify_report_run_id=site-1
}

step_wrong() {
  ap "$ROOT/playbooks/verify.yml" -e vllm_verify_report_run_id=verify-wrong -e '{"vllm_profile": {"kv_cache_dtype": "fp8"}}'
  local rc=$?
  say "wrong expectation: rc=$rc ($([[ $rc != 0 ]] && echo 'failed, as it must' || echo 'PASSED: verification is broken'))"
  [[ $rc != 0 ]]
}

security() {
  "$NS" exec systemd-analyze security --no-pager "$UNIT" >"$LOGS/security-$1.txt" 2>&1
  local main; main=$(sysctl_ show -p MainPID --value "$UNIT")
  { echo "MainPID $main (namespace)"; "$NS" exec sh -c "grep -E 'NoNewPrivs|Cap(Inh|Prm|Eff|Bnd|Amb)|Seccomp|Uid' /proc/$main/status"
    "$NS" exec sh -c "cat /proc/$main/cgroup; grep 'Max open files' /proc/$main/limits"
    echo "## limits"; limits; } >"$LOGS/process-$1.txt" 2>&1
  say "systemd-analyze security ($1): $(grep 'Overall exposure' "$LOGS/security-$1.txt")"
}

restart_with_streams() {  # $1: label
  ensure_up || return 1
  "$PY" scripts/gpu-host/drain.py "$URL" "$MODEL_ID" 4 2000 "$LOGS/streams-$1.json" >"$LOGS/streams-$1.txt" 2>&1 &
  local client=$! t0 t1
  sleep 4
  t0=$(now); sysctl_ restart "$UNIT"; t1=$(now)
  local healthy; healthy=$(health_wait 400)
  wait "$client"
  say "restart ($1): stop+start issued in $(secs "$t0" "$t1") s, then healthy after $healthy s; streams: $(cat "$LOGS/streams-$1.txt")"
}

step_restart() { security site1; restart_with_streams no-backstop; }

step_site2() {
  ensure_up || return 1
  ap "$ROOT/site.yml" "${SITE_SKIP[@]}" -e vllm_verify_report_run_id=site-2 -e "$CHANGE2"
  local rc=$?
  security site2
  return $rc
}

step_drain() {
  grep -q -- '--shutdown-timeout' /etc/vllm/main.args.json || { say "drain: site2 did not deploy the backstop"; return 1; }
  restart_with_streams backstop-20s
}

step_bare() {
  ensure_up || return 1
  local t0 t1
  t0=$(now); sysctl_ stop "$UNIT"; t1=$(now); gpu_free
  say "systemctl stop (idle, backstop 20 s): $(secs "$t0" "$t1") s"
  local argv=() env=()
  mapfile -d '' argv < <("$PY" -c 'import json, sys; sys.stdout.write("\0".join(json.load(open(sys.argv[1]))) + "\0")' \
    /etc/vllm/main.args.json)
  # The environment file as systemd reads it: KEY=VALUE, a double-quoted value unescaped.
  mapfile -d '' env < <("$PY" -c '
import re, sys
for line in open(sys.argv[1], encoding="utf-8"):
    m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", line.rstrip("\n"))
    if m:
        v = m.group(2)
        if len(v) >= 2 and v[0] == v[-1] == "\"":
            v = re.sub(r"\\(.)", r"\1", v[1:-1])
        sys.stdout.write(f"{m.group(1)}={v}\0")' /etc/vllm/main.env)
  printf '%s\n' "${env[@]}" | grep -v API_KEY >"$LOGS/bare-env.txt"
  # The unit's ExecStart and EnvironmentFile, as its user, with no sandbox (no systemd at all).
  t0=$(now)
  (cd /var/lib/vllm && exec setsid setpriv --reuid=vllm --regid=vllm --init-groups env -i PATH=/usr/bin:/bin "${env[@]}" \
    /opt/vllm/venvs/vllm-0.26.0/bin/python /opt/vllm/bin/vllm-launch serve "${argv[@]}") >"$LOGS/bare.log" 2>&1 &
  local pid=$! healthy
  healthy=$(health_wait 400)
  say "bare start (the unit's command and environment, as user vllm, no systemd): healthy after $healthy s"
  { limits "$pid"; grep -E 'NoNewPrivs|Cap(Eff|Bnd)|Seccomp:' "/proc/$pid/status"; } >"$LOGS/process-bare.txt" 2>&1
  kill -TERM -- -"$pid" 2>/dev/null; sleep 5; kill -KILL -- -"$pid" 2>/dev/null; wait "$pid" 2>/dev/null; gpu_free
  # The same command started again by systemd, sandboxed: time to healthy under the unit.
  t0=$(now); sysctl_ start "$UNIT"
  healthy=$(health_wait 400)
  say "unit start (sandboxed, same command and environment): healthy after $healthy s"
  security unitstart
}

step_site3() {
  ensure_up || return 1
  ap "$ROOT/site.yml" "${SITE_SKIP[@]}" -e vllm_verify_report_run_id=site-3 -e "$CHANGE3"
  local rc=$?
  say "site3 (a change that fails at start): rc=$rc; $(grep -oE 'Restored the last working release [^ ]+ \([^)]*\)' "$LOGS/site3.log" | head -n1)"
  health_wait 30 >/dev/null && say "after site3: the restored release answers /health"
  [[ $rc != 0 ]]
}

run_steps() {
  local budget=${1:-100000} start=$SECONDS s rc t0
  for s in "${STEPS[@]}"; do
    [[ -f $WORK/done/$s ]] && continue
    if (( SECONDS - start + COST[$s] > budget )); then say "stop before $s: ${COST[$s]} s would pass the budget"; break; fi
    t0=$(now)
    "step_$s" >"$LOGS/$s.log" 2>&1
    rc=$?
    say "step $s: rc=$rc in $(secs "$t0" "$(now)") s $(grep -A1 'PLAY RECAP' "$LOGS/$s.log" 2>/dev/null | tail -n1 | tr -s ' ')"
    pack
    # A step's rc is its result (a wrong expectation must fail); a failed preparation or first deployment
    # stops the run (every later step needs them), and the next run tries it again.
    if [[ $s == prepare || $s == site1 ]] && [[ $rc != 0 ]]; then tail -n 20 "$LOGS/$s.log" >&2; return 1; fi
    touch "$WORK/done/$s"
  done
}

case ${1:-} in
  probe) probe ;;
  stage) "$PY" benchmarks/gpu/parts.py stage ;;
  run) run_steps "${2:-100000}"; tail -n 30 "$LOGS/summary.txt" ;;
  *) echo "usage: $0 probe | stage | run [BUDGET_S]" >&2; exit 2 ;;
esac
