"""Filters that write values the way systemd reads them back: ExecStart lines, environment-file values."""

import re
from typing import Any

from ansible.errors import AnsibleFilterError

# systemd_env_quote (same file): a value of an EnvironmentFile= file, double-quoted. In such a file systemd
# reads `\\`, `\"`, `\$` and `\``  back as the character itself inside double quotes and keeps everything else
# as written (spaces, %, single quotes), so any text without control characters reads back byte for byte.
# Control characters are refused: the plan (vllm_fleet.inputs) refuses them first, naming the setting.

_PLAIN = re.compile(r"^[A-Za-z0-9_@./:=,+-]+$")


def systemd_quote(value):
    """Quote one argument for ExecStart (systemd.syntax: quoting, specifiers, variables)."""
    if not isinstance(value, str):
        raise AnsibleFilterError(f"systemd_quote: argument {value!r} is a {type(value).__name__}, not a string")
    if "\n" in value:
        raise AnsibleFilterError(f"systemd_quote: argument {value!r} has a newline, which ExecStart cannot carry")
    escaped = value.replace("%", "%%").replace("$", "$$")
    if value and _PLAIN.match(value):
        return escaped
    return "'" + escaped.replace("\\", "\\\\").replace("'", "\\'") + "'"


_ENV_ESCAPE = re.compile(r'([\\"$`])')
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def systemd_env_quote(value):
    """Quote one value of an environment file (systemd.exec, EnvironmentFile=) so that it reads back as is."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise AnsibleFilterError(f"systemd_env_quote: a value of type {type(value).__name__} is not text")
    text = str(value)
    if _CONTROL.search(text):
        raise AnsibleFilterError(
            "systemd_env_quote: a value holds a control character, which an environment "
            "file cannot carry (the value is not shown)"
        )
    return '"' + _ENV_ESCAPE.sub(r"\\\1", text) + '"'


def systemd_exec_lines(args):
    if not isinstance(args, (list, tuple)):
        raise AnsibleFilterError(f"systemd_exec_lines: expected a list of arguments, got {args!r}")
    lines: list[list[Any]] = []  # [quoted text, starts with an option, option and value joined]
    for arg in args:
        arg = str(arg) if isinstance(arg, (int, float)) else arg
        starts_option = isinstance(arg, str) and arg.startswith("--")
        if lines and not starts_option and lines[-1][1] and not lines[-1][2]:
            lines[-1][0] += " " + systemd_quote(arg)
            lines[-1][2] = True
        else:
            lines.append([systemd_quote(arg), starts_option, False])
    return [line for line, _, _ in lines]


_ENV_UNESCAPE = re.compile(r'\\([\\"$`])')


def systemd_env_value(text, name):
    """The value of NAME in an environment file written with systemd_env_quote (its inverse), or "" when the file
    does not set it. Only double-quoted values (what the role writes) and bare words are read."""
    if not isinstance(text, str) or not isinstance(name, str):
        raise AnsibleFilterError("systemd_env_value expects the file's text and a variable name")
    value = ""
    for line in text.splitlines():
        key, sep, raw = line.partition("=")
        if not sep or key.strip() != name or line.lstrip().startswith("#"):
            continue
        raw = raw.strip()
        value = _ENV_UNESCAPE.sub(r"\1", raw[1:-1]) if len(raw) >= 2 and raw[0] == raw[-1] == '"' else raw
    return value


# Each filter is documented in plugins/filter/<filter>.yml, which ansible-doc -t filter reads.
class FilterModule:
    def filters(self):
        # What the templates and the rollback use; systemd_quote is the helper behind systemd_exec_lines.
        return {
            "systemd_exec_lines": systemd_exec_lines,
            "systemd_env_quote": systemd_env_quote,
            "systemd_env_value": systemd_env_value,
        }
