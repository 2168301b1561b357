#!/usr/bin/env bash
# site.yml, unmodified, on an H200 host that is its own controller (gpu/inventory), under a real
# systemd (namespace.sh), with what such a host lacks replaced and nothing else: the wheels come from a
# local wheelhouse (no package registry there), the weights are dummy ones with the catalogue's
# dimensions (no model hub). docs/gpu-host-site.md has the results.
#
#   gpu/host/site.sh probe          read what the host has (Python, venv, apt, devices), boot
#                                           systemd, run the nvidia_driver role under it (needs the
#                                           ansible wheels in .gpu/wheels/ansible and .gpu/systemd/*.deb)
#   gpu/host/site.sh stage          copy a bundle part (.gpu/part-NN) into /tmp/gpu-bundle
#   gpu/host/site.sh run [BUDGET]   run, in order, the steps not yet done on this host while they
#                                           fit in BUDGET seconds (default: all of them); run it again
#                                           to go on; GPU_HOST_SKIP_STEPS=bare,wrong leaves those out
#                                           (they stay "not run" in the results). Steps:
#     prepare      join and check the bundle (gpu/bench/build-bundle.sh), ansible-core, the
#                  wheelhouse, the dummy model, boot systemd
#     site1        site.yml without vLLM's drain backstop (vllm_shutdown_timeout 0: no --shutdown-timeout):
#                  plan, driver, install, stage, unit, start, health, verify, release 1
#     wrong        playbooks/verify.yml expecting an fp8 KV cache: must fail on that read-back
#     restart      systemctl restart of release 1 with 4 streams in flight (no drain backstop): time to healthy
#     site2        site.yml with max_num_seqs 32 in the profile and vllm_shutdown_timeout 20 (the backstop):
#                  the rollout's restart, verification, release 2
#     drain        systemctl restart of release 2 with 4 streams in flight (backstop 20 s): every stream finishes
#     bare         the unit's exact command and environment started outside systemd (no sandbox), then
#                  the unit started again: time to healthy without and with the sandbox
#     site3        site.yml with release 2's settings and a tokenizer folder the host lacks: the plan and vLLM's
#                  parser accept it, the start fails, the rollout restores release 2
# Each step_ function says what counts as its success; a step fails unless that evidence is there, and the
# evidence (or what is missing) goes into the summary. `run` exits 1 when a step has failed.
# Writes into $OUT (default .gpu-site-out): summary.txt and logs.tar.gz (every log, the unit, its
# security report, the verification reports and plan.json ($WORK/reports), the journal), refreshed after
# every step.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
OUT=${OUT:-$ROOT/.gpu-site-out}
WORK=/var/tmp/gpu-host-site
LOGS=$WORK/logs
ASITE=$WORK/ansible
# The plan's and the verifications' reports (vllm_report_dir), packed with the logs.
REPORTS=$WORK/reports
NS=$ROOT/gpu/host/namespace.sh
# The files brought to the host (bundle parts, the systemd .debs, the ansible wheels) and ansible.posix (its
# task timer): in this checkout, or in another one that holds them (GPU_HOST_FILES, GPU_HOST_COLLECTIONS).
GPU=${GPU_HOST_FILES:-$ROOT/.gpu}
COLLECTIONS=${GPU_HOST_COLLECTIONS:-$ROOT/.cache/collections}
PY=$(command -v python3)
MODEL_ID=Qwen/Qwen2.5-7B-Instruct
UNIT=vllm@main.service
URL=http://127.0.0.1:8000
# The instance's files as the vllm role writes them (vllm_config_dir /etc/vllm, instance main).
ARGS=/etc/vllm/main.args.json
ENVFILE=/etc/vllm/main.env
RELEASES=/etc/vllm/releases/main
WHEELHOUSE=/opt/vllm-site/wheelhouse/vllm-0.26.0-cp312
# What each site.yml run sets beyond the inventory, all of it first-class settings (-e, JSON so that numbers
# stay numbers). Release 1: no drain backstop (vllm_shutdown_timeout 0 renders no --shutdown-timeout, so vLLM
# aborts what is in flight on SIGTERM), which `restart` measures.
SET1='{"vllm_shutdown_timeout": 0}'
# Release 2: a profile key and the backstop, each changing the unit's arguments (--max-num-seqs 32,
# --shutdown-timeout 20), so the rollout restarts the service.
SET2='{"vllm_profile": {"max_num_seqs": 32}, "vllm_shutdown_timeout": 20}'
# site3: release 2's settings and one fault that the plan and vLLM's parser accept and the start refuses: the
# tokenizer (vllm_extra_args, as the inventory gives it) in a folder the host does not have. The plan cannot see
# the host's files and vLLM's parser opens no path; vLLM's start loads the tokenizer before /health answers and
# fails (no such folder, and offline no hub to look the name up in), systemd starts it again and the health wait
# gives up: "crashed during start", the failure step_site3 counts. Faults that would not do: CUDA_VISIBLE_DEVICES in
# vllm_environment and a gpu_memory_utilization too small for the weights are refused by the plan (placement;
# sizing), so nothing restarts; a flag vLLM's parser refuses stops the host before its unit changes; an impossible
# vllm_verify_smoke_latency_budget would fail the restored release's verification too, so the rollback would fail.
BAD_TOKENIZER=/var/lib/vllm/models/Qwen--Qwen2.5-7B-Instruct/no-such-tokenizer
SET3="{\"vllm_profile\": {\"max_num_seqs\": 32}, \"vllm_shutdown_timeout\": 20,
 \"vllm_extra_args\": {\"load_format\": \"dummy\", \"tokenizer\": \"$BAD_TOKENIZER\"}}"
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
ap() { ansible_cli playbook -i "$ROOT/gpu/inventory" -e "vllm_report_dir=$REPORTS" "$@"; }
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

gpu_free() {  # wait until the GPU's memory is back (the engine core ends after the API server); 1 if not in 60 s
  local _
  for _ in $(seq 1 60); do
    (( $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -n1) < 2048 )) && return 0
    sleep 1
  done
  return 1
}

# The evidence of a step (gpu/host/evidence.py): its finding goes into the summary, its status is the
# check's.
ev() {
  local said rc
  said=$("$PY" gpu/host/evidence.py "$@" 2>&1)
  rc=$?
  say "  $([[ $rc == 0 ]] && echo evidence || echo 'MISSING evidence'): $said"
  return $rc
}
current_release() { cat "$RELEASES/current" 2>/dev/null; }
# The KV cache the running engine sized (vllm:cache_config_info) and whether this start of the unit compiled vLLM's
# graphs or loaded them from the compile cache an earlier start wrote (its journal since the start), beside the
# first-start and warm-restart predictions of the latest verification report: the planner's error on both kinds.
kv_line() {
  local since; since=$(sysctl_ show -p ActiveEnterTimestamp --value "$UNIT" 2>/dev/null)
  "$NS" exec journalctl --no-pager -o cat -u "$UNIT" --since "${since:-today}" >"$LOGS/journal-$1.txt" 2>&1
  local report; report=$(ls -t "$REPORTS"/site-*/report.json 2>/dev/null | head -n1)
  "$PY" gpu/host/evidence.py kv "$URL/metrics" "$LOGS/journal-$1.txt" "${report:-none}" gpu-host \
    >>"$LOGS/kv.txt" 2>&1 && say "kv ($1): $(tail -n1 "$LOGS/kv.txt")"
}
# systemd gives every start of a unit a new InvocationID: a changed one means the service was started again.
invocation() { sysctl_ show -p InvocationID --value "$UNIT" 2>/dev/null; }
# The first error ansible-playbook printed in a step's log (a plan refusal names the host, the setting and the fix).
failure_of() { grep -m1 -E '^\[ERROR\]|fatal: ' "$LOGS/$1.log" | cut -c1-600; }

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
  rm -rf "$d/reports" "$d/reports-missing.txt"
  if [[ -d $REPORTS ]]; then cp -r "$REPORTS" "$d/reports"; else echo "no reports in $REPORTS yet" >"$d/reports-missing.txt"; fi
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
  "$PY" gpu/host/prepare.py ansible-cfg --to "$WORK/ansible.cfg" --work "$WORK" --collections "$COLLECTIONS"
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
    "$PY" gpu/bench/bundle.py assemble --parts /tmp/gpu-bundle/parts --parts "$GPU" --sums "$GPU/SHA256SUMS" \
      --to "$WORK/bundle" || return 1
    touch "$WORK/bundle.done"
  fi
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$ASITE" "$WORK"/bundle/wheels/ansible/*.whl || return 1
  "$PY" gpu/host/prepare.py wheelhouse --wheels "$WORK/bundle/wheels/vllm" --to "$WHEELHOUSE" || return 1
  "$PY" gpu/host/prepare.py model --id "$MODEL_ID" --to /opt/vllm-site/models || return 1
  "$PY" gpu/host/prepare.py ansible-cfg --to "$WORK/ansible.cfg" --work "$WORK" --collections "$COLLECTIONS" || return 1
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
  health_wait 400 >/dev/null || { say "$UNIT does not answer /health"; return 1; }
}

# Success: site.yml passes; the site-1 report verifies the instance ok, with no rollback; the unit runs without
# --shutdown-timeout (what `restart` measures); a release is recorded (release 1).
step_site1() {
  ap "$ROOT/site.yml" "${SITE_SKIP[@]}" -e vllm_verify_report_run_id=site-1 -e "$SET1" \
    || { say "site1: site.yml failed: $(failure_of site1)"; return 1; }
  ev report "$REPORTS/site-1" gpu-host --ok --no-rollback || return 1
  ev args "$ARGS" --without shutdown-timeout || return 1
  kv_line site1
  local id; id=$(current_release)
  [[ -n $id ]] || { say "site1: no release recorded in $RELEASES"; return 1; }
  echo "$id" >"$WORK/release-1"
  say "site1: release 1 is $id"
}

# Success: verify.yml fails and its report fails the instance on the read-back of the KV cache's dtype (the
# profile now expects fp8, release 1 runs auto). verify.yml failing for any other reason alone (no report, the
# health check, a plan error) fails the step; so does verify.yml passing.
step_wrong() {
  ensure_up || return 1
  ap "$ROOT/playbooks/verify.yml" -e vllm_verify_report_run_id=verify-wrong -e "$SET1" \
    -e '{"vllm_profile": {"kv_cache_dtype": "fp8"}}'
  local rc=$?
  if [[ $rc == 0 ]]; then say "wrong expectation: verify.yml PASSED an fp8 expectation: verification is broken"; return 1; fi
  say "wrong expectation: verify.yml rc=$rc"
  ev report "$REPORTS/verify-wrong" gpu-host --failed --error-contains kv_cache_dtype
}

security() {
  "$NS" exec systemd-analyze security --no-pager "$UNIT" >"$LOGS/security-$1.txt" 2>&1
  local main; main=$(sysctl_ show -p MainPID --value "$UNIT")
  { echo "MainPID $main (namespace)"; "$NS" exec sh -c "grep -E 'NoNewPrivs|Cap(Inh|Prm|Eff|Bnd|Amb)|Seccomp|Uid' /proc/$main/status"
    "$NS" exec sh -c "cat /proc/$main/cgroup; grep 'Max open files' /proc/$main/limits"
    echo "## limits"; limits; } >"$LOGS/process-$1.txt" 2>&1
  say "systemd-analyze security ($1): $(grep 'Overall exposure' "$LOGS/security-$1.txt")"
}

# systemctl restart with 4 streamed completions (2,000 tokens each) in flight. $1: label; $2: "all" when every
# stream must finish, else "any"; the rest: what the unit's arguments must hold (evidence.py args).
# Success: the arguments hold that; systemctl restart succeeds; the service is a new start (InvocationID) and
# answers /health again within 400 s; the 4 streams had tokens and were open when the restart was issued.
restart_with_streams() {
  local label=$1 finish=$2; shift 2
  ensure_up || return 1
  ev args "$ARGS" "$@" || return 1
  local before; before=$(invocation)
  "$PY" gpu/host/drain.py "$URL" "$MODEL_ID" 4 2000 "$LOGS/streams-$label.json" >"$LOGS/streams-$label.txt" 2>&1 &
  local client=$! t0 t1 rc healthy up
  sleep 4
  t0=$(now); sysctl_ restart "$UNIT"; rc=$?; t1=$(now)
  healthy=$(health_wait 400); up=$?
  wait "$client"
  say "restart ($label): systemctl restart rc=$rc, returned after $(secs "$t0" "$t1") s, then healthy after $healthy s; streams: $(cat "$LOGS/streams-$label.txt")"
  [[ $rc == 0 && $up == 0 ]] || return 1
  kv_line "restart-$label"
  [[ $(invocation) != "$before" ]] || { say "restart ($label): the unit's InvocationID is unchanged: no new start"; return 1; }
  if [[ $finish == all ]]; then
    ev streams "$LOGS/streams-$label.json" 4 --at "$t0" --all-finished
  else
    ev streams "$LOGS/streams-$label.json" 4 --at "$t0"
  fi
}

# Success: as restart_with_streams, release 1 without --shutdown-timeout. How many streams finish is what it
# measures (vLLM aborts them on SIGTERM without the backstop), not its verdict.
step_restart() { security site1; restart_with_streams no-backstop any --without shutdown-timeout; }

# Success: site.yml passes, and so a plan refusal, like any other failure of it, fails the step; the service
# started again (a new InvocationID); the site-2 report verifies it ok with no rollback; the unit runs
# --max-num-seqs 32 --shutdown-timeout 20; a new release is recorded (release 2, not release 1).
step_site2() {
  ensure_up || return 1
  local before id rc
  before=$(invocation)
  ap "$ROOT/site.yml" "${SITE_SKIP[@]}" -e vllm_verify_report_run_id=site-2 -e "$SET2"
  rc=$?
  security site2
  [[ $rc == 0 ]] || { say "site2: site.yml failed (rc=$rc): $(failure_of site2)"; return 1; }
  [[ $(invocation) != "$before" ]] || { say "site2: the service was not started again (InvocationID unchanged)"; return 1; }
  ev report "$REPORTS/site-2" gpu-host --ok --no-rollback || return 1
  ev args "$ARGS" --with max-num-seqs 32 --with shutdown-timeout 20 || return 1
  kv_line site2
  id=$(current_release)
  if [[ -z $id || $id == "$(cat "$WORK/release-1" 2>/dev/null)" ]]; then
    say "site2: no new release recorded in $RELEASES (current: ${id:-none})"; return 1
  fi
  echo "$id" >"$WORK/release-2"
  say "site2: release 2 is $id"
}

# Success: as restart_with_streams, release 2 with --shutdown-timeout 20, and every stream finishes with its
# 2,000 tokens: the backstop let them finish.
step_drain() { restart_with_streams backstop-20s all --with shutdown-timeout 20; }

# Success: systemctl stop succeeds and the GPU's memory is freed; the bare start answers /health within 400 s;
# ended, it frees the GPU again; systemctl start succeeds and the unit answers /health within 400 s.
step_bare() {
  ensure_up || return 1
  local t0 t1 rc
  t0=$(now); sysctl_ stop "$UNIT"; rc=$?; t1=$(now)
  say "systemctl stop (idle, backstop 20 s): rc=$rc in $(secs "$t0" "$t1") s"
  [[ $rc == 0 ]] || return 1
  gpu_free || { say "bare: the GPU's memory is still in use after the unit stopped"; return 1; }
  local argv=() env=()
  mapfile -d '' argv < <("$PY" -c 'import json, sys; sys.stdout.write("\0".join(json.load(open(sys.argv[1]))) + "\0")' \
    "$ARGS")
  # The environment file as systemd reads it: KEY=VALUE, a double-quoted value unescaped.
  mapfile -d '' env < <("$PY" -c '
import re, sys
for line in open(sys.argv[1], encoding="utf-8"):
    m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", line.rstrip("\n"))
    if m:
        v = m.group(2)
        if len(v) >= 2 and v[0] == v[-1] == "\"":
            v = re.sub(r"\\(.)", r"\1", v[1:-1])
        sys.stdout.write(f"{m.group(1)}={v}\0")' "$ENVFILE")
  printf '%s\n' "${env[@]}" | grep -v API_KEY >"$LOGS/bare-env.txt"
  # The unit's ExecStart and EnvironmentFile, as its user, with no sandbox (no systemd at all).
  t0=$(now)
  (cd /var/lib/vllm && exec setsid setpriv --reuid=vllm --regid=vllm --init-groups env -i PATH=/usr/bin:/bin "${env[@]}" \
    /opt/vllm/venvs/vllm-0.26.0/bin/python /opt/vllm/bin/vllm-launch serve "${argv[@]}") >"$LOGS/bare.log" 2>&1 &
  local pid=$! healthy bare_up unit_up
  healthy=$(health_wait 400); bare_up=$?
  say "bare start (the unit's command and environment, as user vllm, no systemd): healthy after $healthy s"
  { limits "$pid"; grep -E 'NoNewPrivs|Cap(Eff|Bnd)|Seccomp:' "/proc/$pid/status"; } >"$LOGS/process-bare.txt" 2>&1
  kill -TERM -- -"$pid" 2>/dev/null; sleep 5; kill -KILL -- -"$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  gpu_free || { say "bare: the GPU's memory is still in use after the bare start ended"; return 1; }
  # The same command started again by systemd, sandboxed: time to healthy under the unit.
  t0=$(now); sysctl_ start "$UNIT"; rc=$?
  healthy=$(health_wait 400); unit_up=$?
  say "unit start (sandboxed, same command and environment): rc=$rc, healthy after $healthy s"
  security unitstart
  [[ $bare_up == 0 ]] || { say "bare: the bare start did not answer /health"; return 1; }
  [[ $rc == 0 && $unit_up == 0 ]] || { say "bare: the unit did not start again and answer /health"; return 1; }
}

# Success, all of: release 2 runs before (site2 recorded it); site.yml fails (the rollout stops by design)
# saying it restored release 2 and verified it serving; the site-3 report has that rollback, for the failure
# that counts, "crashed during start" (the health wait of the changed release: the fault failed vLLM's start),
# and the restored release verified ok; the service's journal since the step began names the missing
# tokenizer folder (the faulty release did start); afterwards release 2 is current, its arguments and
# environment are the installed ones, and the instance answers /health and streams a completion to its end.
# A plan refusal, a parse refusal (nothing restarts, nothing rolls back) or a failure to restore fails it.
step_site3() {
  ensure_up || return 1
  local id2 since rc
  id2=$(cat "$WORK/release-2" 2>/dev/null)
  [[ -n $id2 && $(current_release) == "$id2" ]] \
    || { say "site3: release 2 is not the running release (site2: ${id2:-none}; current: $(current_release))"; return 1; }
  [[ ! -e $BAD_TOKENIZER ]] || { say "site3: $BAD_TOKENIZER exists: the fault would be none"; return 1; }
  since=$(date +%s)
  ap "$ROOT/site.yml" "${SITE_SKIP[@]}" -e vllm_verify_report_run_id=site-3 -e "$SET3"
  rc=$?
  say "site3 (a tokenizer folder the host lacks): site.yml rc=$rc; $(failure_of site3)"
  [[ $rc != 0 ]] || { say "site3: site.yml PASSED with a tokenizer folder that does not exist"; return 1; }
  ev restored "$LOGS/site3.log" "$id2" || return 1
  ev report "$REPORTS/site-3" gpu-host --ok --rolled-back-to "$id2" --reason-contains "crashed during start" || return 1
  local seen; seen=$("$NS" exec journalctl --no-pager -o cat -u "$UNIT" --since "@$since" | grep -c -F "$BAD_TOKENIZER")
  say "site3: the service's journal names $BAD_TOKENIZER on ${seen:-0} lines since the step began"
  (( ${seen:-0} > 0 )) || return 1
  [[ $(current_release) == "$id2" ]] || { say "site3: the current release is $(current_release), not $id2"; return 1; }
  if ! { cmp -s "$ARGS" "$RELEASES/$id2/${ARGS##*/}" && cmp -s "$ENVFILE" "$RELEASES/$id2/${ENVFILE##*/}"; }; then
    say "site3: the installed arguments or environment are not release 2's"; return 1
  fi
  health_wait 30 >/dev/null || { say "site3: the restored release does not answer /health"; return 1; }
  "$PY" gpu/host/drain.py "$URL" "$MODEL_ID" 1 16 "$LOGS/serves-site3.json" >"$LOGS/serves-site3.txt" 2>&1
  ev streams "$LOGS/serves-site3.json" 1 --all-finished
}

run_steps() {  # 0 when every step that ran passed; a failed step is recorded as such and not tried again
  local budget=${1:-100000} start=$SECONDS s rc t0 failed=0
  for s in "${STEPS[@]}"; do
    [[ -f $WORK/done/$s ]] && continue
    if [[ ",${GPU_HOST_SKIP_STEPS:-}," == *",$s,"* ]]; then say "step $s: skipped (GPU_HOST_SKIP_STEPS)"; continue; fi
    if (( SECONDS - start + COST[$s] > budget )); then say "stop before $s: ${COST[$s]} s would pass the budget"; break; fi
    t0=$(now)
    "step_$s" >"$LOGS/$s.log" 2>&1
    rc=$?
    say "step $s: $([[ $rc == 0 ]] && echo ok || echo "FAILED (rc=$rc)") in $(secs "$t0" "$(now)") s $(grep -A1 'PLAY RECAP' "$LOGS/$s.log" 2>/dev/null | tail -n1 | tr -s ' ')"
    pack
    # A failed preparation or first deployment stops the run (every later step needs them), and the next run
    # tries it again; any other step is recorded with its result, and the run goes on.
    if [[ $s == prepare || $s == site1 ]] && [[ $rc != 0 ]]; then tail -n 20 "$LOGS/$s.log" >&2; return 1; fi
    if [[ $rc == 0 ]]; then echo ok >"$WORK/done/$s"; else echo failed >"$WORK/done/$s"; failed=1; fi
  done
  return $failed
}

results() {  # each step's result on this host so far; 1 when one has failed
  local s r line="" bad=0
  for s in "${STEPS[@]}"; do
    r="not run"
    [[ -f $WORK/done/$s ]] && r=$(cat "$WORK/done/$s") && r=${r:-done}
    [[ $r == failed ]] && bad=1
    line+=" $s: $r;"
  done
  say "results:${line%;}"
  return $bad
}

case ${1:-} in
  probe) probe ;;
  stage) "$PY" gpu/bench/parts.py stage ;;
  run) run_steps "${2:-100000}"; rc=$?; tail -n 30 "$LOGS/summary.txt"; results || rc=1; exit "$rc" ;;
  *) echo "usage: $0 probe | stage | run [BUDGET_S]" >&2; exit 2 ;;
esac
