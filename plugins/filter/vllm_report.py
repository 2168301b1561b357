# A thin Ansible filter over vllm_fleet.fragments: one event of the run report that vllm_verify, playbooks/benchmark.yml
# and playbooks/diagnose.yml write (the vllm_report_write action writes it and the report).
from __future__ import annotations

import os
import sys

from ansible.errors import AnsibleFilterError

# The library of this checkout, beside the plugin (never another installed copy): every filter plugin loads it so.
_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)
from vllm_fleet import fragments as _fragments  # (the standard library only)


def vllm_report_fragment(data, host, kind, instance=None):
    try:
        return _fragments.fragment(
            str(host) if isinstance(host, str) else host,
            kind,
            data,
            instance=str(instance) if isinstance(instance, str) else instance,
        )
    except ValueError as exc:
        raise AnsibleFilterError("vllm_report_fragment: %s" % exc) from exc


# Each filter is documented in plugins/filter/<filter>.yml, which ansible-doc -t filter reads.
class FilterModule:
    """The run report's filters."""

    def filters(self):
        return {
            "vllm_report_fragment": vllm_report_fragment,
        }
