"""plugins/filter/systemd_args.py: ExecStart lines and environment-file values written as systemd reads them
back (what the unit and environment templates use; the units themselves run under real systemd in Molecule)."""

import pytest
from ansible.errors import AnsibleFilterError

from conftest import ROOT, load_source

plugin = load_source("systemd_args_filter", ROOT / "plugins" / "filter" / "systemd_args.py")


def test_exports_only_what_the_roles_and_templates_use():
    filters = plugin.FilterModule().filters()
    assert set(filters) == {"systemd_exec_lines", "systemd_env_quote", "systemd_env_value"}
    sources = [*(ROOT / "templates").glob("*.j2"), *(ROOT / "roles").glob("*/tasks/*.yml")]
    used = {name for name in filters if any(name in p.read_text() for p in sources)}
    assert used == set(filters)


def test_exec_lines_one_option_with_its_value_per_line():
    args = [
        "/srv/models/m",
        "--max-num-seqs",
        64,
        "--enable-prefix-caching",
        "--gpu-memory-utilization",
        0.9,
        "--speculative-config",
        '{"method": "ngram", "num_speculative_tokens": 3}',
    ]
    assert plugin.systemd_exec_lines(args) == [
        "/srv/models/m",
        "--max-num-seqs 64",
        "--enable-prefix-caching",
        "--gpu-memory-utilization 0.9",
        """--speculative-config '{"method": "ngram", "num_speculative_tokens": 3}'""",
    ]


def test_exec_lines_escape_specifiers_variables_and_quotes():
    # systemd expands %x and $VAR in ExecStart: each is doubled so the argument reaches vLLM as written.
    assert plugin.systemd_exec_lines(["--served-model-name", "team%a$b"]) == ["--served-model-name 'team%%a$$b'"]
    assert plugin.systemd_exec_lines(["--chat-template", "it's \\n"]) == ["--chat-template 'it\\'s \\\\n'"]
    assert plugin.systemd_exec_lines(["--x", ""]) == ["--x ''"]


@pytest.mark.parametrize(
    "args, message",
    [
        ("--max-num-seqs 64", "expected a list of arguments"),
        (["--api-key", "a\nb"], "has a newline"),
        (["--x", None], "is a NoneType, not a string"),
    ],
)
def test_exec_lines_refuse_what_execstart_cannot_carry(args, message):
    with pytest.raises(AnsibleFilterError, match=message):
        plugin.systemd_exec_lines(args)


def test_env_quote_reads_back_as_written():
    assert plugin.systemd_env_quote("a \"b\" $c `d` \\e %f 'g'") == '"a \\"b\\" \\$c \\`d\\` \\\\e %f \'g\'"'
    assert plugin.systemd_env_quote(0) == '"0"'


@pytest.mark.parametrize("value", [True, None, ["x"], "tab\there", "bell\x07"])
def test_env_quote_refuses_non_text_and_control_characters_without_showing_them(value):
    with pytest.raises(AnsibleFilterError) as err:
        plugin.systemd_env_quote(value)
    if isinstance(value, str):
        assert value not in str(err.value) and "control character" in str(err.value)


@pytest.mark.parametrize("value", ['lab "key" \\ $HOME %h', "plain", "a`b\\\\c", "'single' quotes, spaces", ""])
def test_env_value_reads_back_what_env_quote_wrote(value):
    """The rollback reads the restored release's key from its environment file: the exact inverse of env_quote."""
    text = f"# a comment\nHOME=/var/lib/vllm\nVLLM_API_KEY={plugin.systemd_env_quote(value)}\nOTHER=x\n"
    assert plugin.systemd_env_value(text, "VLLM_API_KEY") == value
    assert plugin.systemd_env_value('HOME=/x\n#VLLM_API_KEY="no"\n', "VLLM_API_KEY") == ""
    with pytest.raises(AnsibleFilterError):
        plugin.systemd_env_value(None, "VLLM_API_KEY")
