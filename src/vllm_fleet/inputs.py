"""Plan-time checks of the strings a host's systemd unit and environment file are written from.

The unit and the environment file are templates: a newline in a path, a user name or an environment value
would add a line of its own (an ``ExecStartPre=+...`` that runs as root, an ``LD_PRELOAD=``), and systemd's
own ``systemd-analyze verify`` accepts such a file. So every such string is checked here, on the controller,
before any host is changed, for what its file can hold as written:

- unit file: paths absolute and clean, with no whitespace (``ReadWritePaths=`` splits on it), ``%`` (a unit
  specifier), quotes, backslashes or control or format characters (CONTROL); user and group valid names; device
  entries a ``/dev`` path or a ``char-``/``block-`` class; system-call filter entries calls or ``@groups``;
- environment file: keys POSIX names, not the keys the template sets itself; values (the API key too) are
  written double-quoted with systemd's escapes (the ``systemd_env_quote`` filter), so any text without control or
  format characters reads back byte for byte; the API key and tokens are named in a message but never shown;
- keys that carry the site's guarantees (offline, no telemetry) or the loader's (``LD_PRELOAD``,
  ``PYTHONPATH``...) only with an explicit opt-in, ``vllm_environment_allow``; the keys the template sets
  from the role's own settings (caches, ``HOME``, the API key) never.

The release and model-staging settings that only make sense together (a wheelhouse install needs its URL, a
model source its location) are checked here too, so that the vllm role's preflight has nothing left to refuse; their
URLs, words of a command line and of requests, hold no control or format character either. CONTROL is every character
of Unicode's categories Cc, Cf, Zl and Zp (U+2028, U+2029 and U+0085 end a line for some readers), for the gateway's
and the monitoring's values too. Each error names the host, the one setting, its value (not a secret's) and the fix.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
import sys
import unicodedata
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from . import custody


def short(value: Any, limit: int = 120, render: Callable[[Any], str] = repr) -> str:
    """A value for an error message: rendered (its repr by default) and cut to `limit` characters. The one such
    helper of the package and its filter plugins (here, in the standard-library module every other one may import)."""
    text = render(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def whole(value: Any) -> int | None:
    """A whole number of the inventory: an int, or a string of ASCII digits only (-e gives strings, and a Vault value
    is its plaintext); None for anything else: a bool, spaces (a template may write the value as given), and digits of
    other scripts, which int() would refuse or read otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) or type(value).__name__ == "EncryptedString":  # ansible-core's !vault value
        text = str(value)
        return int(text) if re.fullmatch(r"[0-9]+", text) else None
    return None


SECRET_WORDS = ("key", "token", "password", "secret")


def is_secret(name: str, option: Mapping[str, Any]) -> bool:
    """A setting whose value is never shown, nor recorded but by its digest: no_log in its spec, or a name that says
    key, token, password or secret."""
    return bool(option.get("no_log")) or any(word in name.lower() for word in SECRET_WORDS)


# Words that hold "token" but name no secret: counts of tokens and the tokenizer.
_NOT_SECRET_WORDS = re.compile(r"tokens|tokeniz(er|ation)")


def is_secret_argument(name: str) -> bool:
    """A vLLM argument whose value is never shown (snake_case or a --flag): named key, token, password or secret
    (api_key, hf_token), not a count of tokens or the tokenizer (num_speculative_tokens, max_num_batched_tokens)."""
    return is_secret(_NOT_SECRET_WORDS.sub("", name.lstrip("-").replace("-", "_")), {})


def plain(value: Any) -> Any:
    """Ansible's lazy containers and tagged strings as plain Python, so that messages and digests see plain values."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    for kind in (bool, str, int, float):  # bool before int: True is an int too
        if isinstance(value, kind):
            return kind(value)
    return value


# Every variable these checks read; the filter plugin fills the vllm role's defaults where the inventory is silent.
UNIT_VARS = (
    "vllm_user",
    "vllm_group",
    "vllm_state_dir",
    "vllm_cache_dir",
    "vllm_home",
    "vllm_config_dir",
    "vllm_instance",
    "vllm_bind_address",
    "vllm_port",
    "vllm_device_allow",
    "vllm_environment",
    "vllm_environment_allow",
    "vllm_api_key",
    "vllm_hf_token",
    "vllm_install_source",
    "vllm_wheelhouse_url",
    "vllm_signed_manifest_url",
    "vllm_signed_manifest_public_key",
    "vllm_keep_releases",
    "vllm_model_source",
    "vllm_model_url",
    "vllm_model_src",
    "vllm_draft_model_source",
    "vllm_draft_model_url",
    "vllm_draft_model_src",
    "vllm_syscall_filter",
    "vllm_shutdown_timeout",
    "vllm_timeout_stop_sec",
    "vllm_allowed_clients",
)

# Unicode's control (Cc), format (Cf), line separator (Zl) and paragraph separator (Zp) characters: a newline, U+0085
# NEXT LINE, U+2028 or U+2029 ends a line for some reader of a unit, an environment file, a HAProxy or Prometheus
# configuration or a log; a zero-width or direction mark (U+200B, U+FEFF, U+202E...) hides what a value says.
# Their ranges in Unicode 14.0.0 (Python 3.11's unicodedata); under another Unicode version they are computed from
# unicodedata once, at import (tests/unit/vllm_fleet/test_inputs.py checks the two agree).
CONTROL_CATEGORIES = ("Cc", "Cf", "Zl", "Zp")
_CONTROL_UNICODE = "14.0.0"
_CONTROL_RANGES = (
    (0x0000, 0x001F),
    (0x007F, 0x009F),
    (0x00AD, 0x00AD),
    (0x0600, 0x0605),
    (0x061C, 0x061C),
    (0x06DD, 0x06DD),
    (0x070F, 0x070F),
    (0x0890, 0x0891),
    (0x08E2, 0x08E2),
    (0x180E, 0x180E),
    (0x200B, 0x200F),
    (0x2028, 0x202E),
    (0x2060, 0x2064),
    (0x2066, 0x206F),
    (0xFEFF, 0xFEFF),
    (0xFFF9, 0xFFFB),
    (0x110BD, 0x110BD),
    (0x110CD, 0x110CD),
    (0x13430, 0x13438),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0001, 0xE0001),
    (0xE0020, 0xE007F),
)


def control_ranges(categories: tuple[str, ...] = CONTROL_CATEGORIES) -> tuple[tuple[int, int], ...]:
    """The code point ranges of `categories` in this Python's unicodedata, over the whole code space."""
    ranges: list[tuple[int, int]] = []
    start = None
    for point in range(sys.maxunicode + 2):
        inside = point <= sys.maxunicode and unicodedata.category(chr(point)) in categories
        if inside and start is None:
            start = point
        elif not inside and start is not None:
            ranges.append((start, point - 1))
            start = None
    return tuple(ranges)


def _character_class(ranges: tuple[tuple[int, int], ...]) -> str:
    return "[" + "".join(f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges) + "]"


CONTROL = re.compile(
    _character_class(_CONTROL_RANGES if unicodedata.unidata_version == _CONTROL_UNICODE else control_ranges())
)
# For messages: what such a character can do where the value is written.
CONTROL_WHAT = (
    "a control or format character (a line or paragraph separator, a newline, a zero-width or direction mark)"
)


def control_character(value: Any) -> str | None:
    """The first control or format character of a string (CONTROL), named for a message (``U+2028 LINE
    SEPARATOR``), or None when it has none or is not a string."""
    found = CONTROL.search(value) if isinstance(value, str) else None
    if found is None:
        return None
    character = found.group()
    return " ".join(filter(None, (f"U+{ord(character):04X}", unicodedata.name(character, ""))))


UNSAFE_IN_UNIT_PATH = re.compile(r"[\s%\"'\\;]")
NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
INSTANCE = re.compile(r"[A-Za-z0-9_-]+")
ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
DEVICE = re.compile(r"(/dev/[A-Za-z0-9._/+-]+|char-[A-Za-z0-9._-]+|block-[A-Za-z0-9._-]+)")
SYSCALL = re.compile(r"~?@?[a-z0-9_-]+(:[A-Za-z0-9_]+)?")  # a call or @group, ~ for a deny list, :errno

# What templates/vllm.env.j2 sets from the role's own settings: a second assignment would silently win.
TEMPLATE_ENV = (
    "VLLM_TARGET_DEVICE",
    "HOME",
    "VLLM_CACHE_ROOT",
    "XDG_CACHE_HOME",
    "TORCHINDUCTOR_CACHE_DIR",
    "TRITON_CACHE_DIR",
    "HF_HOME",
    "VLLM_API_KEY",
)
# What the plan's placement gives each instance (vllm_fleet.placement): its own cards.
PLACEMENT_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
# The site's guarantees (nothing leaves it) and what changes which code the service loads: only with an
# explicit opt-in (vllm_environment_allow), since a later assignment wins over the template's own.
GUARDED_ENV = (
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "VLLM_NO_USAGE_STATS",
    "DO_NOT_TRACK",
    "FLASHINFER_NO_DOWNLOAD",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "PYTHONUSERBASE",
)


def _path(host: str, name: str, value: Any) -> list[str]:
    fix = "fix: an absolute, normalised path of letters, digits and ._-/ (for example /var/lib/vllm)"
    if not isinstance(value, str) or not value:
        return [f"{host}: {name}={value!r} must be a path; {fix}"]
    if CONTROL.search(value):
        return [
            f"{host}: {name}={value!r} holds {CONTROL_WHAT}, {control_character(value)}, which would add a line "
            f"to the unit or hide what it holds; {fix}"
        ]
    if UNSAFE_IN_UNIT_PATH.search(value):
        return [
            f"{host}: {name}={value!r} holds whitespace, %, a quote, ; or a backslash, which the unit cannot "
            f"hold as written; {fix}"
        ]
    if not value.startswith("/") or posixpath.normpath(value) != value or value == "/":
        return [f"{host}: {name}={value!r} is not an absolute, normalised path; {fix}"]
    return []


def _text(host: str, name: str, value: Any, secret: bool = False) -> list[str]:
    """A value of the environment file, written double-quoted: systemd reads back any text without control or
    format characters byte for byte (quotes, backslashes, $, % and spaces included)."""
    shown = "(value not shown)" if secret else repr(value)
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        return [f"{host}: {name} {shown} must be a string; fix: quote it in the inventory"]
    if CONTROL.search(str(value)):
        which = "" if secret else f", {control_character(str(value))},"
        return [
            f"{host}: {name} {shown} holds {CONTROL_WHAT}{which} which would add a line to the environment file "
            "or hide what it holds; fix: remove it" + (" and re-encrypt the value with ansible-vault" if secret else "")
        ]
    return []


def _release(host: str, values: Mapping[str, Any], draft: bool) -> list[str]:
    """Settings that need one another: the install's and the model's (and with a draft model, the draft's)
    sources and their locations. ``vllm_draft_model_source`` comes resolved (planner.deploy_inputs: it follows
    the model's source unless set)."""
    errors = []
    for name in ("vllm_wheelhouse_url", "vllm_model_url", "vllm_draft_model_url"):
        # Words of the install's command line and the staging's requests: a line break would split or end them.
        if control_character(values.get(name)):
            errors.append(
                f"{host}: {name}={values[name]!r} holds {CONTROL_WHAT}, {control_character(values[name])}; "
                "fix: remove it (a URL or path has none)"
            )
    if values.get("vllm_install_source") == "wheelhouse" and not values.get("vllm_wheelhouse_url"):
        errors.append(
            f"{host}: vllm_install_source=wheelhouse needs vllm_wheelhouse_url, which is empty; fix: the URL "
            "or path of a wheelhouse built by scripts/wheelhouse.sh (wheels plus requirements.lock)"
        )
    errors += _signed(host, values, draft)
    keep = values.get("vllm_keep_releases")
    if keep is not None and (isinstance(keep, bool) or not str(keep).strip().isdigit() or int(str(keep)) < 2):
        errors.append(
            f"{host}: vllm_keep_releases={keep!r} must be at least 2 (the running release and one to roll "
            "back to); fix: 3"
        )
    for prefix in ("vllm_model", "vllm_draft_model") if draft else ("vllm_model",):
        source = values.get(f"{prefix}_source")
        # A location the inventory builds from the plan's own output is not in `values`: the role checks it.
        if source == "url" and f"{prefix}_url" in values and not values[f"{prefix}_url"]:
            errors.append(
                f"{host}: {prefix}_source=url needs {prefix}_url, which is empty; fix: the base URL of the "
                "model's files and manifest on the site's mirror"
            )
        elif source in ("controller", "path") and f"{prefix}_src" in values and not values[f"{prefix}_src"]:
            where = "on the controller" if source == "controller" else "on the host"
            errors.append(
                f"{host}: {prefix}_source={source} needs {prefix}_src, which is empty; fix: the model's folder {where}"
            )
        elif source in ("controller", "path"):
            errors += _path(host, f"{prefix}_src", values[f"{prefix}_src"]) if source == "path" else []
    return errors


def signed_settings(host: str, values: Mapping[str, Any]) -> list[str]:
    """The signed manifest's URL (the http(s) URL of a BUNDLE.sha256) and the key to check it with, when the URL is
    set: its errors."""
    url = values.get("vllm_signed_manifest_url")
    if not url:
        return []
    parts = urllib.parse.urlsplit(str(url))
    if parts.scheme not in ("http", "https") or not parts.netloc or not parts.path.endswith("/BUNDLE.sha256"):
        return [
            f"{host}: vllm_signed_manifest_url={short(url)} must be the http(s) URL of the mirror's BUNDLE.sha256; "
            "fix: e.g. http://mirror.site/BUNDLE.sha256 (playbooks/bundle.yml keeps it at the mirror's root), or empty"
        ]
    if not values.get("vllm_signed_manifest_public_key"):
        return [
            f"{host}: vllm_signed_manifest_url is set but vllm_signed_manifest_public_key is empty; fix: the path on "
            "the controller of the site's minisign public key (site.pub) that signs the bundle"
        ]
    return []


def _signed(host: str, values: Mapping[str, Any], draft: bool) -> list[str]:
    """The chain of custody's settings (vllm_fleet.custody): the signed manifest's URL, the key to check it with, and
    every folder the host takes from the mirror under that manifest's root."""
    url = values.get("vllm_signed_manifest_url")
    if not url:
        return []
    errors = signed_settings(host, values)
    if errors:
        return errors
    base = str(url).rsplit("/", 1)[0] + "/"  # the mirror's root, as custody.SignedManifest.base gives it
    folders = []
    if values.get("vllm_install_source") == "wheelhouse":
        folders.append("vllm_wheelhouse_url")
    for prefix in ("vllm_model", "vllm_draft_model") if draft else ("vllm_model",):
        if values.get(f"{prefix}_source") == "url":
            folders.append(f"{prefix}_url")
    for name in folders:
        folder = values.get(name)
        if folder and custody.relative(base, str(folder)) is None:
            errors.append(
                f"{host}: {name}={short(folder)} is not under the mirror of vllm_signed_manifest_url ({base}): nothing "
                "the site signed vouches for what it serves; fix: serve it from that mirror, or leave "
                "vllm_signed_manifest_url empty for a site without a signed bundle"
            )
    return errors


def check(host: str, values: Mapping[str, Any], draft: bool = False) -> list[str]:
    """The errors of a host's unit and environment strings and its release and staging settings (``values``: the
    UNIT_VARS it has; ``draft``: the profile stages a draft model)."""
    errors: list[str] = []
    for name in ("vllm_user", "vllm_group"):
        value = values.get(name)
        if value is not None and not (isinstance(value, str) and NAME.fullmatch(value)):
            errors.append(
                f"{host}: {name}={value!r} is not a valid user or group name; fix: lower-case letters, "
                "digits, _ and -, starting with a letter or _, at most 32 characters (for example vllm)"
            )
    for name in ("vllm_state_dir", "vllm_cache_dir", "vllm_home", "vllm_config_dir"):
        if values.get(name) is not None:
            errors += _path(host, name, values[name])
    instance = values.get("vllm_instance")
    if instance is not None and not (isinstance(instance, str) and INSTANCE.fullmatch(instance)):
        errors.append(
            f"{host}: vllm_instance={instance!r} must be letters, digits, _ and - (it names the unit "
            "vllm@<instance>.service and its files); fix: for example main or gpu0"
        )
    port = values.get("vllm_port")
    if port is not None:
        try:
            number = int(str(port))
        except ValueError:
            number = 0
        if isinstance(port, bool) or not 1 <= number <= 65535:
            errors.append(
                f"{host}: vllm_port={port!r} must be a port number from 1 to 65535; fix: such a number, or "
                "no vllm_port at all for the fleet's default (roles/vllm_defaults)"
            )
    address = values.get("vllm_bind_address")
    if address is not None:
        try:
            ipaddress.ip_address(str(address))
        except ValueError:
            errors.append(
                f"{host}: vllm_bind_address={address!r} is not an IP address; fix: the host's internal "
                "address, 127.0.0.1, or 0.0.0.0 for every interface"
            )
    errors += _stop(host, values.get("vllm_shutdown_timeout"), values.get("vllm_timeout_stop_sec"))
    allowed = values.get("vllm_allowed_clients")
    if allowed is not None:
        try:
            networks(host, "vllm_allowed_clients", allowed)
        except ValueError as exc:
            errors.append(str(exc))
    devices = values.get("vllm_device_allow")
    if devices is not None:
        if not isinstance(devices, (list, tuple)):
            errors.append(
                f"{host}: vllm_device_allow={devices!r} must be a list of device paths; fix: for example "
                "['/dev/nvidiactl', '/dev/nvidia0']"
            )
        else:
            for device in devices:
                if not (isinstance(device, str) and DEVICE.fullmatch(device)):
                    errors.append(
                        f"{host}: vllm_device_allow entry {device!r} is not a /dev path or a char-/block- "
                        "device class; fix: for example /dev/nvidia0 or char-nvidia-uvm"
                    )
    filters = values.get("vllm_syscall_filter")
    for entry in filters if isinstance(filters, (list, tuple)) else []:
        if not (isinstance(entry, str) and SYSCALL.fullmatch(entry)):
            errors.append(
                f"{host}: vllm_syscall_filter entry {entry!r} is not a system call or @group; fix: for "
                "example @system-service, or ~@privileged to deny a group"
            )
    errors += _environment(host, values.get("vllm_environment"), values.get("vllm_environment_allow"))
    errors += _release(host, values, draft)
    for name in ("vllm_api_key", "vllm_hf_token"):
        if values.get(name):
            errors += _text(host, name, values[name], secret=True)
    return errors


def networks(host: str, setting: str, entries: Any) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """The addresses or networks of a list setting (vllm_allowed_clients), normalised; ValueError names the host,
    the setting, the value and the fix."""
    if isinstance(entries, (str, bytes, Mapping)) or not hasattr(entries, "__iter__"):
        raise ValueError(
            f"{host}: {setting}={entries!r} must be a list of addresses or networks; fix: the "
            "monitoring hosts, e.g. [10.0.20.5, 10.0.21.0/24]"
        )
    result = []
    for entry in entries:
        try:
            result.append(ipaddress.ip_network(str(entry), strict=False))
        except ValueError:
            raise ValueError(
                f"{host}: {setting} has {entry!r}, not an IP address or network; fix: an address "
                "such as 10.0.20.5 or a network such as 10.0.20.0/24"
            ) from None
    return result


def _environment(host: str, environment: Any, allow: Any) -> list[str]:
    if allow is not None and not (
        isinstance(allow, (list, tuple)) and all(isinstance(name, str) and ENV_KEY.fullmatch(name) for name in allow)
    ):
        return [
            f"{host}: vllm_environment_allow={short(allow)} must be a list of variable names; fix: for example "
            "[PYTHONPATH], the keys of vllm_environment you opt in knowingly"
        ]
    if environment is None:
        return []
    if not isinstance(environment, Mapping):
        return [
            f"{host}: vllm_environment={environment!r} must be a dict of NAME: value; fix: for example "
            '{OMP_NUM_THREADS: "8"}'
        ]
    allowed = set(allow or [])
    errors = []
    for key, value in environment.items():
        key = str(key)
        if not ENV_KEY.fullmatch(key):
            errors.append(
                f"{host}: vllm_environment key {key!r} is not a variable name; fix: letters, digits and _, "
                "not starting with a digit"
            )
            continue
        if key in PLACEMENT_ENV:
            errors.append(
                f"{host}: vllm_environment.{key} would override the cards the plan gives each instance (one "
                "per GPU or tensor-parallel group, by UUID); fix: remove it, and set vllm_gpu.count or the "
                "profile's tensor_parallel_size to place the instances"
            )
            continue
        if key == "VLLM_ALLOW_RUNTIME_LORA_UPDATING":
            errors.append(
                f"{host}: vllm_environment.{key} would open vLLM's runtime LoRA endpoints behind the plan's back; fix: "
                "remove it and set vllm_lora_runtime_updates: true (the plan then checks and sets it)"
            )
            continue
        if key in TEMPLATE_ENV:
            errors.append(
                f"{host}: vllm_environment.{key} would override what the unit's environment file sets "
                f"from the role's own settings; fix: remove it and set "
                f"{'vllm_api_key' if key == 'VLLM_API_KEY' else 'vllm_state_dir, vllm_cache_dir or vllm_target_device'}"
            )
            continue
        if key in GUARDED_ENV and key not in allowed:
            what = (
                "changes which code the service loads"
                if key.startswith(("LD_", "PYTHON"))
                else "turns off one of the site's guarantees (offline, no usage statistics)"
            )
            errors.append(
                f"{host}: vllm_environment.{key} {what}; fix: remove it, or opt in knowingly with "
                f"vllm_environment_allow: [{key}]"
            )
            continue
        secret = any(word in key.upper() for word in ("KEY", "TOKEN", "SECRET", "PASSWORD"))
        errors += _text(host, f"vllm_environment.{key}", value, secret=secret)
    return errors


# systemd's stop must outlast vLLM's own drain, or it kills the requests that --shutdown-timeout lets finish.
STOP_MARGIN_SECONDS = 10


def _stop(host: str, shutdown: Any, stop: Any) -> list[str]:
    numbers = {}
    for name, value in (("vllm_shutdown_timeout", shutdown), ("vllm_timeout_stop_sec", stop)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return [f"{host}: {name}={value!r} must be a whole number of seconds, 0 or more; fix: for example 30"]
        numbers[name] = value
    if len(numbers) == 2 and numbers["vllm_shutdown_timeout"] + STOP_MARGIN_SECONDS > numbers["vllm_timeout_stop_sec"]:
        return [
            f"{host}: vllm_timeout_stop_sec={stop} does not outlast vllm_shutdown_timeout={shutdown} by "
            f"{STOP_MARGIN_SECONDS} s: systemd would kill the requests vLLM is letting finish; fix: "
            f"vllm_timeout_stop_sec: {shutdown + STOP_MARGIN_SECONDS + 20} or more, or a smaller vllm_shutdown_timeout"
        ]
    return []
