"""The order of a tune search's loads (roles/vllm_rollout/tasks/tune.yml, "Measure the candidates round by round"):
rounds outer, candidates inner, so that every round restarts and loads vLLM's defaults, the profile, the derived
batching... once each, in the same order, with the round's seed (issue #49: a drift of the host over the search falls
on every candidate alike; each round sends them all the same prompts). The task's own loop expression, rendered by
ansible-core's templar; molecule/fleet/tests/test_tune.py runs a search on the lab (one round of three candidates:
three restarts)."""

import itertools

import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from conftest import ROOT

TASKS = ROOT / "roles" / "vllm_rollout" / "tasks"
CANDIDATES = {
    "vllm-defaults": {"args": {"gpu0": ["Qwen/Qwen2.5-7B-Instruct"]}},
    "profile": {"args": {"gpu0": ["Qwen/Qwen2.5-7B-Instruct", "--max-num-seqs", "64"]}},
    "derived": {"args": {"gpu0": ["Qwen/Qwen2.5-7B-Instruct", "--max-num-seqs", "77"]}},
}


def search_task() -> dict:
    block = next(t for t in yaml.safe_load((TASKS / "tune.yml").read_text()) if "block" in t)["block"]
    (task,) = [t for t in block if t["name"] == "Measure the candidates round by round"]
    return task


def turns(repeats: int) -> list[tuple[int, str, int]]:
    """(round, candidate, the seed its load gets) of each turn, in the order the search runs them."""
    task = search_task()
    variables = {"vllm_tune_repeats": str(repeats), "vllm_rollout_tune_candidates": {"candidates": CANDIDATES}}
    templar = Templar(loader=DataLoader(), variables=variables)
    out = []
    for turn in templar.template(trust_as_template(task["loop"])):
        each = Templar(loader=DataLoader(), variables={task["loop_control"]["loop_var"]: turn})
        repeat = each.template(trust_as_template(task["vars"]["__vllm_tune_repeat"]))
        candidate = each.template(trust_as_template(task["vars"]["__vllm_tune_candidate"]))
        out.append((int(repeat), candidate["key"], int(repeat)))
    return out


def test_the_rounds_are_outer_and_the_candidates_inner_in_the_same_order():
    assert turns(2) == [
        (1, "vllm-defaults", 1),
        (1, "profile", 1),
        (1, "derived", 1),
        (2, "vllm-defaults", 2),
        (2, "profile", 2),
        (2, "derived", 2),
    ]
    # Five rounds (the playbook's default): five loads of each candidate, never two of one in a row.
    five = turns(5)
    assert len(five) == 15 and all(a[1] != b[1] for a, b in itertools.pairwise(five))
    assert {c: [r for r, n, _ in five if n == c] for c in CANDIDATES} == {c: [1, 2, 3, 4, 5] for c in CANDIDATES}


def test_each_turn_restarts_its_candidate_and_loads_it_once_with_the_rounds_seed():
    """A turn (tune_candidate.yml) starts the candidate (roles/vllm's tune_candidate: the drop-in and the restart
    the fleet test counts) and includes one load (tune_repeat.yml, no loop of its own) whose seed is the round; with
    one round of three candidates that is three restarts, as molecule/fleet/tests/test_tune.py counts."""
    turn = yaml.safe_load((TASKS / "tune_candidate.yml").read_text())
    starts = [t for t in turn if (t.get("ansible.builtin.include_role") or {}).get("tasks_from") == "tune_candidate"]
    loads = [t for t in turn if t.get("ansible.builtin.include_tasks") == "tune_repeat.yml"]
    assert len(starts) == 1 and len(loads) == 1 and "loop" not in loads[0] and "loop" not in starts[0]
    assert starts[0]["when"] == "__vllm_tune_fits | bool"
    # A candidate whose answers were a no-go on its first start (the answers gate) is not loaded.
    assert loads[0]["when"] == [
        "__vllm_tune_fits | bool",
        "__vllm_tune_candidate.key not in __vllm_tune_answers_refused | default([])",
    ]
    gates = [t for t in turn if t.get("ansible.builtin.include_tasks") == "answers_gate.yml"]
    assert len(gates) == 1 and "__vllm_tune_repeat | int == 1" in gates[0]["when"]
    assert gates[0]["vars"]["__vllm_rollout_answers_fatal"] is False
    (load,) = [t for t in yaml.safe_load((TASKS / "tune_repeat.yml").read_text()) if "include_role" in str(t)]
    assert load["vars"]["vllm_tune_seed"] == "{{ __vllm_tune_repeat }}"
    assert len(turns(1)) == 3


def test_the_playbook_runs_five_rounds_by_default_within_a_budget_that_fits_them():
    (play,) = yaml.safe_load((ROOT / "playbooks" / "tune.yml").read_text())
    assert play["vars"]["vllm_tune_repeats"] == 5
    # 3 candidates (the default limit of 2 besides vLLM's defaults) x 5 rounds, each a restart of up to 300 s and a
    # load of up to 60 s.
    assert play["vars"]["vllm_tune_limit"] == 2 and play["vars"]["vllm_tune_budget_s"] >= 3 * 5 * (300 + 60)
