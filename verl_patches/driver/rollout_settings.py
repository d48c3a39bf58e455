"""The rollout engine's settings that follow from others, and the rules that keep verl's rollout config,
vLLM and vllm-ascend from contradicting each other (pure; each problem names the key to change).

What reaches the engine: verl's vLLMRollout passes ``actor_rollout_ref.rollout.engine_kwargs.vllm`` to
``LLM`` as keyword arguments, so the A3 profiles put there ``max_num_seqs`` (= train_batch_size x n /
rollout DP, the sequences one engine holds at once, as the vendor computes it) and vllm-ascend's
``additional_config`` (TorchAir graph mode and its batch size, the Ascend scheduler). The rules below are
the ones vLLM 0.9.1 and vllm-ascend 0.9.1 enforce at engine start on A3 (scheduler and TorchAir configs),
stated here so a contradiction is refused before 256 ranks load a model, plus the two that verl's own
checks protected and our declared patch of ``vLLMRollout.__init__`` drops (F1):

* verl refused ``enforce_eager=False`` with ``free_cache_engine=True``: a captured CUDA graph keeps the KV
  cache's addresses. On A3 the graph is TorchAir's, which takes the KV cache as an input every step, and our
  lifecycle frees the cache after every generate and re-creates it with the first init's block count (F3);
  ACL graphs (vllm-ascend's other graph mode) would capture addresses, and vllm-ascend refuses them for
  DeepSeek anyway. So: ``free_cache_engine`` must stay True (nothing else frees the cache between
  phases) and ``enforce_eager=False`` needs TorchAir graph mode on.
* verl refused chunked prefill with ``max_num_batched_tokens < max_model_len``; vLLM V1 supports exactly
  that. What must hold instead is the converse: below ``max_model_len`` chunked prefill must be on, in
  vLLM's scheduler and in vllm-ascend's (which otherwise forces it off and refuses the engine).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from verl_patches.base.config_access import get
from verl_patches.base.job_layout import Cluster, RolloutParallel

R = "actor_rollout_ref.rollout"
ENGINE = f"{R}.engine_kwargs.vllm"
EXTRA = f"{ENGINE}.additional_config"
GRAPH = f"{EXTRA}.torchair_graph_config"
SCHEDULER = f"{EXTRA}.ascend_scheduler_config"
# vllm-ascend's TorchairGraphConfig raises RuntimeError for each of these when graph mode is off
GRAPH_ONLY = (
    "use_cached_graph",
    "use_cached_kv_cache_bytes",
    "graph_batch_sizes",
    "graph_batch_sizes_init",
    "enable_multistream_mla",
    "enable_multistream_moe",
    "enable_kv_nz",
    "enable_super_kernel",
)


def seqs_per_rollout_engine(train_batch_size: int, n: int, nnodes: int, n_gpus_per_node: int, rollout_tp: int) -> int:
    """Sequences one rollout engine (one TP group) generates per step: verl splits the prompts equally
    over every rank and each TP group generates its ranks' prompts x n. Rounded up, so an uneven split
    (refused elsewhere: layout.rollout_batch) still fits.

    The profiles' ``${overlay_seqs_per_rollout_engine:...}`` hands it the config's numbers; the engines are
    `base.job_layout`'s, so a rollout TP that does not divide the world is refused here, naming its key."""
    engines = RolloutParallel(Cluster(nnodes, n_gpus_per_node).world, tp=rollout_tp).dp
    return seqs_per_engine(train_batch_size, n, engines)


def seqs_per_engine(train_batch_size: int, n: int, engines: int) -> int:
    """train_batch_size x n sequences over ``engines`` rollout engines, rounded up."""
    return -(-int(train_batch_size) * int(n) // engines)


def max_model_len(cfg: Any) -> int:
    return int(get(cfg, f"{R}.max_model_len") or 0) or int(get(cfg, "data.max_prompt_length", 0)) + int(
        get(cfg, "data.max_response_length", 0)
    )


# vLLM 0.9.1's keys for a model's own length limit (vllm/config.py `_get_and_verify_max_len`): the smallest wins
LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)


def model_length_limit(model: Mapping[str, Any]) -> tuple[int | None, str]:
    """The longest max_model_len vLLM 0.9.1 accepts for this HF config (without
    VLLM_ALLOW_LONG_MAX_MODEL_LEN), and how it follows from the config; None when no key bounds it. As
    vLLM derives it: the smallest length key (``model_max_length`` wins when set), then RoPE scaling other
    than su/longrope/llama3 multiplies it by its factor, YaRN starting from its
    ``original_max_position_embeddings`` instead. A ``model_max_length`` above that still admits lengths
    up to itself. ValueError names a key that is not a positive number (vLLM would crash on it)."""

    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and 0 < v < float("inf")

    for k in LENGTH_KEYS:
        if model.get(k) is not None and not number(model[k]):
            raise ValueError(f"the model's config key {k!r} is {model[k]!r}, not a positive number")
    found = [(model[k], k) for k in LENGTH_KEYS if model.get(k) is not None]
    if not found:
        return None, "no length key in the model's config"
    length, key = min(found)
    if model.get("model_max_length"):
        length, key = model["model_max_length"], "model_max_length"
    how = f"{key} {length:g}"
    scaling = model.get("rope_scaling")
    if isinstance(scaling, Mapping):
        rope_type = scaling.get("rope_type", scaling.get("type"))
        if rope_type not in ("su", "longrope", "llama3"):
            factor = scaling.get("factor", 1.0)
            if not number(factor):
                raise ValueError(f"the model's config key 'rope_scaling.factor' is {factor!r}, not a positive number")
            if rope_type == "yarn":
                length = scaling.get("original_max_position_embeddings")
                if not number(length):
                    raise ValueError(
                        f"the model's config key 'rope_scaling.original_max_position_embeddings' is {length!r}, "
                        "not a positive number (YaRN needs it)"
                    )
                how = f"YaRN original_max_position_embeddings {length:g}"
            length *= factor
            how += f" x rope_scaling.factor {factor:g}"
    limit = int(length)
    extra = model.get("model_max_length")
    if isinstance(extra, (int, float)) and extra > limit:
        limit, how = int(extra), f"model_max_length {extra:g}"
    return limit, how


def engine_max_num_seqs(cfg: Any) -> int | None:
    """What the engine receives (engine_kwargs.vllm.max_num_seqs); None: vLLM's default."""
    value = get(cfg, f"{ENGINE}.max_num_seqs")
    return None if value is None else int(value)


def graph_enabled(cfg: Any) -> bool:
    return bool(get(cfg, f"{GRAPH}.enabled", False))


def rollout_problems(cfg: Any) -> list[str]:
    """Contradictions in the vLLM rollout's settings, one line each naming the key to change."""
    if get(cfg, f"{R}.name") != "vllm":
        return []
    out: list[str] = []
    eager = bool(get(cfg, f"{R}.enforce_eager", True))
    seqs = engine_max_num_seqs(cfg)
    verl_seqs = get(cfg, f"{R}.max_num_seqs")
    if seqs is not None and verl_seqs is not None and int(verl_seqs) != seqs:
        out.append(
            f"{ENGINE}.max_num_seqs={seqs} but {R}.max_num_seqs={verl_seqs}: the engine receives the first; "
            f"set one value (the profiles interpolate one from the other)"
        )
    if seqs is not None and seqs < 1:
        out.append(f"{ENGINE}.max_num_seqs={seqs} must be >= 1")
    if not get(cfg, f"{R}.free_cache_engine", True):
        out.append(
            f"{R}.free_cache_engine=False: the rollout's KV cache is freed after every generate and rebuilt "
            f"before the next (the lifecycle that replaces vLLM's sleep mode); nothing keeps it, set True"
        )
    out += _graph_problems(cfg, eager, seqs)
    out += _prefill_problems(cfg, seqs)
    out += _kv_block_problems(cfg, seqs)
    return out


VLLM_ASCEND_BLOCK_SIZE = 128  # vllm_ascend/platform.py sets it when the config leaves it unset
NULL_BLOCKS = 1  # vLLM V1's BlockPool takes one block as its null block


def _kv_block_problems(cfg: Any, seqs: int | None) -> list[str]:
    """A fixed KV block count (``num_gpu_blocks_override``, the CPU proof's: the emulated device's memory is the
    host's) must hold all max_num_seqs sequences at their longest, plus the one block vLLM V1's block pool keeps
    as its null block (vllm/v1/core/block_pool.py): otherwise the scheduler queues the rest and prefills them
    among the others' decodes, in eager steps A3 does not run (A3 sizes its cache from the NPU's memory: it
    holds an engine's 64 sequences of 4096 tokens). Measured in the tiny run: 128 blocks for 128 sequences left
    one queued until the first responses ended, and the graph-decode share fell from 0.82 to 0.78."""
    blocks = get(cfg, f"{ENGINE}.num_gpu_blocks_override")
    if blocks is None or seqs is None:
        return []
    longest = int(get(cfg, "data.max_prompt_length", 0)) + int(get(cfg, "data.max_response_length", 0))
    per_seq = -(-longest // VLLM_ASCEND_BLOCK_SIZE)
    needed = seqs * per_seq + NULL_BLOCKS
    if int(blocks) >= needed:
        return []
    return [
        f"{ENGINE}.num_gpu_blocks_override={blocks} holds {max(int(blocks) - NULL_BLOCKS, 0) // per_seq} of the "
        f"engine's {seqs} sequences (max_num_seqs) at {longest} tokens ({per_seq} block(s) of "
        f"{VLLM_ASCEND_BLOCK_SIZE} each, and vLLM's null block): set it to at least {needed}"
    ]


def _graph_problems(cfg: Any, eager: bool, seqs: int | None) -> list[str]:
    graph = get(cfg, GRAPH) or {}
    if graph_enabled(cfg):
        out = []
        if eager:
            out.append(
                f"{GRAPH}.enabled=True with {R}.enforce_eager=True: vllm-ascend refuses graph mode in eager "
                f"mode; set enforce_eager=False"
            )
        sizes = list(graph.get("graph_batch_sizes") or [])
        if seqs is None:
            out.append(f"{GRAPH}.enabled=True needs {ENGINE}.max_num_seqs (the graph batch size)")
        elif sizes != [seqs]:
            out.append(
                f"{GRAPH}.graph_batch_sizes={sizes} must be [{ENGINE}.max_num_seqs] = [{seqs}]: one graph "
                f"for the batch every engine holds (train_batch_size x n / rollout DP)"
            )
        return out
    out = [
        f"{GRAPH}.{k}={graph.get(k)!r} needs {GRAPH}.enabled=True (vllm-ascend refuses it with graph mode off)"
        for k in GRAPH_ONLY
        if graph.get(k)
    ]
    if not eager:
        out.append(
            f"{R}.enforce_eager=False with {GRAPH}.enabled off: vllm-ascend's other graph mode (ACL graph) "
            f"does not support DeepSeek models; turn TorchAir graph mode on or set enforce_eager=True"
        )
    return out


def chunked_prefill_reason(cfg: Any) -> str | None:
    """Why the engine runs chunked prefill, i.e. steps that mix prefill chunks with decodes, naming the key;
    None when it does not. As vLLM 0.9.1 and vllm-ascend 0.9.1 decide it: vLLM's V1 engine turns chunked
    prefill on whatever ``enable_chunked_prefill`` says (``EngineArgs._set_default_args_v1``) and its
    scheduler cuts prompts to the token budget; only vllm-ascend's Ascend scheduler with its own
    ``enable_chunked_prefill`` off schedules prefills apart from decodes, and vllm-ascend's model runner marks
    a mixed step ``ChunkedPrefill`` unless that scheduler is on without chunking (model_runner_v1.py:987).
    Below ``max_model_len`` the token budget needs chunking (vLLM refuses it otherwise)."""
    scheduler = get(cfg, SCHEDULER) or {}
    batched, length = int(get(cfg, f"{R}.max_num_batched_tokens") or 0), max_model_len(cfg)
    if get(cfg, f"{R}.enable_chunked_prefill", False):
        return f"{R}.enable_chunked_prefill=True"
    if batched and batched < length:
        return f"{R}.max_num_batched_tokens={batched} < max_model_len {length}"
    if not scheduler.get("enabled"):
        return (
            f"{SCHEDULER}.enabled=False: vLLM V1's own scheduler chunks prompts whatever "
            f"{R}.enable_chunked_prefill says"
        )
    if scheduler.get("enable_chunked_prefill"):
        return f"{SCHEDULER}.enable_chunked_prefill=True"
    return None


def _prefill_problems(cfg: Any, seqs: int | None) -> list[str]:
    out = []
    chunked = bool(get(cfg, f"{R}.enable_chunked_prefill", False))
    batched = int(get(cfg, f"{R}.max_num_batched_tokens") or 0)
    length = max_model_len(cfg)
    scheduler = get(cfg, SCHEDULER) or {}
    if batched and batched < length and not chunked:
        why = (
            "vllm-ascend's Ascend scheduler refuses it without chunked prefill"
            if scheduler.get("enabled")
            else "vLLM V1's scheduler chunks prompts then whatever the key says; say so"
        )
        out.append(
            f"{R}.max_num_batched_tokens={batched} < max_model_len {length} needs "
            f"{R}.enable_chunked_prefill=True ({why})"
        )
    if batched and seqs is not None and batched < seqs:
        out.append(f"{R}.max_num_batched_tokens={batched} must be >= {ENGINE}.max_num_seqs={seqs} (vLLM's scheduler)")
    if scheduler.get("enabled") and chunked and bool(scheduler.get("enable_chunked_prefill", False)):
        out.append(
            f"{SCHEDULER}.enabled=True has no effect with chunked prefill on: vllm-ascend 0.9.1's "
            f"AscendScheduler.schedule() returns vLLM's schedule then; set {SCHEDULER}.enabled=False, or turn "
            f"chunked prefill off with {R}.max_num_batched_tokens >= max_model_len {length}"
        )
    elif scheduler.get("enabled") and bool(scheduler.get("enable_chunked_prefill", False)) != chunked:
        out.append(
            f"{SCHEDULER}.enable_chunked_prefill={scheduler.get('enable_chunked_prefill', False)} but "
            f"{R}.enable_chunked_prefill={chunked}: vllm-ascend's scheduler replaces vLLM's and uses its own "
            f"value; make them agree"
        )
    return out


def describe(cfg: Any, engines: int) -> str:
    """One line: what the engine is built with, ``engines`` of them (the layout's rollout DP), for the preflight."""
    seqs = engine_max_num_seqs(cfg)
    tbs, n = get(cfg, "data.train_batch_size"), get(cfg, f"{R}.n")
    seqs_text = (
        f"max_num_seqs {seqs} (train_batch_size {tbs} x n {n} / rollout DP {engines} = "
        f"{seqs_per_engine(tbs, n, engines)})"
        if seqs is not None
        else "max_num_seqs: vLLM's default"
    )
    graph = get(cfg, GRAPH) or {}
    if graph_enabled(cfg):
        streams = [
            k.replace("enable_multistream_", "")
            for k in ("enable_multistream_mla", "enable_multistream_moe")
            if graph.get(k)
        ]
        mode = (
            f"TorchAir graph mode on, graph batch size {list(graph.get('graph_batch_sizes') or [])}, "
            f"multistream {'/'.join(streams) or 'off'}, KV-NZ {'on' if graph.get('enable_kv_nz') else 'off'}"
        )
    else:
        mode = "eager" if get(cfg, f"{R}.enforce_eager", True) else "graph mode off"
    batched, length = int(get(cfg, f"{R}.max_num_batched_tokens") or 0), max_model_len(cfg)
    # what the engine does, not what one key says: vLLM V1 chunks with the Ascend scheduler off
    chunking = chunked_prefill_reason(cfg)
    prefill = (
        f"chunked prefill {'on' if chunking else 'off'} (max_num_batched_tokens {batched}, max_model_len {length})"
    )
    if chunking:
        prefill += f" because {chunking}"
    return f"{mode}; {seqs_text}; {prefill}"
