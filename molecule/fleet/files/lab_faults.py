"""A fault the rollout scenario injects on purpose: a vLLM logits processor that raises on the first batch.

With it (``--logits-processors lab_faults:CrashOnFirstRequest`` and this folder on PYTHONPATH) a release
starts and answers /health, then its engine core dies on the first request and the API server exits 0:
the failure mode of a release that breaks on its first requests. Test-only; never shipped to a host by a role.
"""

from vllm.v1.sample.logits_processor import LogitsProcessor


class CrashOnFirstRequest(LogitsProcessor):
    def __init__(self, vllm_config, device, is_pin_memory):
        pass

    def is_argmax_invariant(self):
        return False

    def update_state(self, batch_update):
        pass

    def apply(self, logits):
        raise RuntimeError("lab fault: this release fails on its first request")
