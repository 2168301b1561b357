"""vllm_fleet.rules: the planner's rules as two lists of small functions of a Sizing, each returning its messages
(the rules' effect on whole plans is tested through planner.plan_host in test_planner.py)."""

from __future__ import annotations

from conftest import RTX4090
from vllm_fleet import profiles, rules, sizing


def sized(**overrides) -> sizing.Sizing:
    """The shipped rtx4090-7b-prefill profile on an RTX 4090 (vLLM 0.33.0), with `overrides`, sized."""
    profile = dict(profiles.resolve("h", "rtx4090-7b-prefill"), **overrides)
    errors: list[str] = []
    size = sizing.size_instance("h", profile, dict(RTX4090), {}, {"vllm_version": "0.33.0"}, 512, 256, errors)
    assert errors == [] and size is not None
    return size


def test_the_rules_are_two_lists_of_functions_of_a_sizing():
    assert rules.ERROR_RULES and rules.WARNING_RULES
    assert not set(rules.ERROR_RULES) & set(rules.WARNING_RULES)
    shipped = sized()
    # The shipped profile passes every rule: each returns an empty list, not None.
    assert [rule(shipped) for rule in rules.ERROR_RULES + rules.WARNING_RULES] == [
        [] for _ in rules.ERROR_RULES + rules.WARNING_RULES
    ]


def test_an_error_rule_names_the_host_the_value_and_the_fix():
    (message,) = [m for rule in rules.ERROR_RULES for m in rule(sized(gpu_memory_utilization=0.99))]
    assert message.startswith("h: gpu_memory_utilization=0.99 is above 0.95") and "fix: 0.90-0.95" in message


def test_a_warning_rule_names_the_host_the_value_and_the_fix():
    messages = [m for rule in rules.WARNING_RULES for m in rule(sized(max_num_seqs=1))]
    assert any(m.startswith("h: max_num_seqs=1 x typical prompt 512 tokens") and "fix:" in m for m in messages)
