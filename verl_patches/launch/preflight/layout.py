"""Preflight: parallel-layout and batch arithmetic of a composed config (pure; no files, no host).

The constraints are the ones the stack enforces at start-up or later (so a layout that passes here
does not die in ``initialize_model_parallel`` on 256 dies): megatron.core 0.8 ``parallel_state``
(world divisible by TP*PP*CP, DP divisible by EP), MindSpeed's ``--moe-tp-extend-ep`` (experts
divisible by TP*EP), MindSpeed-LLM's ``--num-layer-list`` (PP entries summing to the layer count, PP>1),
Megatron's TP splits (heads, vocabulary, FFN sizes), verl v0.4.0's batch dispatch (prompts chunked
equally over every worker for generation; sequences over the Megatron DP ranks for the update) and
vLLM's rollout instances (TP x VLLM_DP_SIZE ranks each, EP over the instance).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from verl_patches.base.job_layout import (
    DIES_PER_NODE_KEY,
    NODES_KEY,
    ROLLOUT_TP_KEY,
    JobLayoutError,
    cluster_of,
    rollout_engines_of,
    rollout_of,
    training_of,
)
from verl_patches.base.overlay_settings import VLLM_DP_KEY
from verl_patches.driver.config_checks import check_config, layout_problems
from verl_patches.driver.rollout_settings import describe, max_model_len, model_length_limit, rollout_problems
from verl_patches.launch.preflight.findings import FAIL, OK, WARN, Context, Finding, get
from verl_patches.launch.settings import SettingsError
from verl_patches.patches.catalog import all_patches
from verl_patches.reshard.errors import InvalidLayoutError
from verl_patches.reshard.layout import MegatronLayout, RolloutLayout
from verl_patches.train_engine.stages import dense_only_message, dense_only_stages

A = "actor_rollout_ref.actor"
M = f"{A}.megatron"
R = "actor_rollout_ref.rollout"
REF = "actor_rollout_ref.ref.megatron"
LAYER_LIST = f"{M}.pipeline_parallel_num_layer_list"


def world_findings(ctx: Context) -> list[Finding]:
    cfg, s = ctx.cfg, ctx.settings
    try:
        cluster = cluster_of(cfg)
    except JobLayoutError as e:  # no world: the rest of the layout cannot be judged
        return [Finding("layout", FAIL, str(e), e.key)]
    nnodes, per_node, world = cluster.nodes, cluster.dies_per_node, cluster.world
    if not ctx.cluster_profile:
        return [
            Finding(
                "layout.world_size",
                OK,
                f"world = {NODES_KEY} {nnodes} x {DIES_PER_NODE_KEY} "
                f"{per_node} = {world} (local profile: NNODES/NPUS_PER_NODE unused)",
            )
        ]
    out = []
    for setting, key, value in (
        ("NNODES", NODES_KEY, nnodes),
        ("NPUS_PER_NODE", DIES_PER_NODE_KEY, per_node),
    ):
        try:
            have = s.int(setting)
        except SettingsError as e:
            out.append(Finding("layout.world_size", FAIL, str(e), setting))
            continue
        if have != value:
            out.append(
                Finding(
                    "layout.world_size",
                    FAIL,
                    f"{setting}={have} ({s.where(setting)}) but {key}={value}: the cluster has "
                    f"{s.get('NNODES')} x {s.get('NPUS_PER_NODE')} dies, the config expects "
                    f"{nnodes} x {per_node} = {world}",
                    f"{setting} / {key}",
                )
            )
    if not out:
        out.append(
            Finding(
                "layout.world_size",
                OK,
                f"world = NNODES {nnodes} x NPUS_PER_NODE {per_node} = {world} = {NODES_KEY} x {DIES_PER_NODE_KEY}",
            )
        )
    return out


def megatron_findings(
    ctx: Context, model: Mapping[str, Any], world: int
) -> tuple[list[Finding], MegatronLayout | None]:
    cfg = ctx.cfg
    try:
        t = training_of(cfg, world)
    except JobLayoutError as e:  # the sizes the checks below split by are refused: they wait for a fix
        return [Finding("layout.megatron_parallel", FAIL, str(e), e.key)], None
    sz = {"tp": t.tp, "pp": t.pp, "ep": t.ep, "cp": t.cp}
    layout = MegatronLayout(world_size=world, **sz)  # the rank arithmetic of the sizes job_layout accepted
    out = [
        Finding(
            "layout.megatron_parallel",
            OK,
            f"TP{t.tp} x PP{t.pp} x CP{t.cp} = {t.tp * t.pp * t.cp} divides world "
            f"{world} -> DP {t.dp}; EP{t.ep} divides DP (megatron.core 0.8 parallel_state)",
        )
    ]

    ref_diff = [
        k
        for k, name in (
            ("tp", "tensor_model_parallel_size"),
            ("pp", "pipeline_model_parallel_size"),
            ("ep", "expert_model_parallel_size"),
            ("cp", "context_parallel_size"),
        )
        if get(cfg, f"{REF}.{name}") is not None and int(get(cfg, f"{REF}.{name}")) != sz[k]
    ]
    if ref_diff and get(cfg, "actor_rollout_ref.actor.use_kl_loss"):
        out.append(
            Finding(
                "layout.ref_matches_actor",
                FAIL,
                f"the ref policy runs on the actor's ranks and parallel state, but its "
                f"{', '.join(ref_diff)} differ(s) from the actor's",
                f"{REF}.* ({', '.join(ref_diff)})",
            )
        )

    out += layer_list_findings(cfg, model, t.pp)
    out += tp_split_findings(model, t.tp, t.ep)
    out += megatron_batch_findings(cfg, layout)
    return out, layout


def layer_list_findings(cfg: Any, model: Mapping[str, Any], pp: int) -> list[Finding]:
    layers = int(model["num_hidden_layers"])
    dense = int(model.get("first_k_dense_replace", 0))
    lst = get(cfg, LAYER_LIST)
    if lst is None:
        if layers % pp:
            return [
                Finding(
                    "layout.layer_list",
                    FAIL,
                    f"num_hidden_layers={layers} is not divisible by PP={pp}: give an uneven split",
                    LAYER_LIST,
                )
            ]
        return [Finding("layout.layer_list", OK, f"{layers} layers / PP{pp} = {layers // pp} per stage")]
    lst = [int(x) for x in lst]
    problems = []
    if len(lst) != pp:
        problems.append(f"has {len(lst)} entries for PP={pp}")
    if pp == 1:
        problems.append("needs PP > 1 (MindSpeed-LLM: dynamic pipeline works with pipeline parallel only)")
    if any(n < 1 for n in lst):
        problems.append("has a stage without layers")
    if sum(lst) != layers:
        problems.append(f"sums to {sum(lst)}, not num_hidden_layers={layers}")
    if problems:
        return [Finding("layout.layer_list", FAIL, f"{lst} " + "; ".join(problems), LAYER_LIST)]
    dense_stages = dense_only_stages(lst, dense, int(model.get("n_routed_experts") or 0))
    if dense_stages:
        return [Finding("layout.layer_list", FAIL, dense_only_message(lst, dense, dense_stages), LAYER_LIST)]
    where = (
        "stage 0"
        if dense <= lst[0]
        else "stages 0.." + str(next(i for i in range(len(lst)) if sum(lst[: i + 1]) >= dense))
    )
    return [
        Finding(
            "layout.layer_list",
            OK,
            f"{lst} sums to num_hidden_layers={layers} over PP{pp}; dense layers 0..{dense - 1} in {where}",
        )
    ]


def tp_split_findings(model: Mapping[str, Any], tp: int, ep: int) -> list[Finding]:
    """Megatron splits heads, vocabulary (padded_vocab_size = vocab_size, make_vocab_size_divisible_by 1),
    the dense FFN and the shared experts over TP; MindSpeed's TP-extend-EP spreads whole experts over TP x EP."""
    key_tp = f"{M}.tensor_model_parallel_size"
    out = []
    bad = [f"{k}={model[k]}" for k in ("num_attention_heads", "vocab_size", "intermediate_size") if int(model[k]) % tp]
    shared = int(model["moe_intermediate_size"]) * int(model.get("n_shared_experts") or 0)
    if shared % tp:
        bad.append(f"moe_intermediate_size x n_shared_experts={shared}")
    out.append(
        Finding("layout.tp_divisibility", FAIL, f"not divisible by TP{tp}: {', '.join(bad)}", key_tp)
        if bad
        else Finding(
            "layout.tp_divisibility",
            OK,
            f"heads {model['num_attention_heads']}, vocab {model['vocab_size']}, "
            f"FFN {model['intermediate_size']}, shared FFN {shared} divide by TP{tp}",
        )
    )
    e = int(model["n_routed_experts"])
    if e % (tp * ep):
        out.append(
            Finding(
                "layout.experts",
                FAIL,
                f"n_routed_experts={e} is not divisible by TP x EP = {tp}x{ep} "
                f"(MindSpeed --moe-tp-extend-ep spreads experts over TP x EP)",
                f"{M}.expert_model_parallel_size / {key_tp}",
            )
        )
    else:
        out.append(
            Finding("layout.experts", OK, f"{e} experts over TP x EP = {tp * ep} ranks: {e // (tp * ep)} per rank")
        )
    return out


def megatron_batch_findings(cfg: Any, layout: MegatronLayout) -> list[Finding]:
    tbs, n = int(get(cfg, "data.train_batch_size")), int(get(cfg, f"{R}.n"))
    mini = int(get(cfg, f"{A}.ppo_mini_batch_size"))
    micro = int(get(cfg, f"{A}.ppo_micro_batch_size_per_gpu") or 1)
    out = []
    minimal = layout.dp * micro
    if (tbs * n) % minimal:
        out.append(
            Finding(
                "layout.batch_megatron_dp",
                FAIL,
                f"train_batch_size x n = {tbs}x{n} = {tbs * n} sequences is not divisible by Megatron DP "
                f"{layout.dp} x ppo_micro_batch_size_per_gpu {micro} = {minimal} (verl _validate_config)",
                "data.train_batch_size",
            )
        )
    elif (mini * n) % layout.dp:
        out.append(
            Finding(
                "layout.batch_megatron_dp",
                FAIL,
                f"ppo_mini_batch_size x n = {mini * n} is not divisible by Megatron DP {layout.dp}: verl "
                f"would silently drop the remainder of every mini-batch",
                f"{A}.ppo_mini_batch_size",
            )
        )
    else:
        out.append(
            Finding(
                "layout.batch_megatron_dp",
                OK,
                f"{tbs * n} sequences per step / Megatron DP {layout.dp} = {tbs * n // layout.dp} per DP rank "
                f"({mini * n // layout.dp // micro} micro-batches of {micro} per optimizer step)",
            )
        )
    return out


def rollout_findings(ctx: Context, model: Mapping[str, Any], world: int) -> list[Finding]:
    cfg = ctx.cfg
    try:
        rollout = rollout_engines_of(cfg, world)
    except JobLayoutError as e:
        return [Finding("layout.rollout_tp", FAIL, str(e), e.key)]
    tp, engines = rollout.tp, rollout.dp
    tbs, n = int(get(cfg, "data.train_batch_size")), int(get(cfg, f"{R}.n"))
    out: list[Finding] = []
    if int(model["num_attention_heads"]) % tp:
        out.append(
            Finding(
                "layout.rollout_tp",
                FAIL,
                f"rollout TP{tp} must divide num_attention_heads {model['num_attention_heads']}",
                ROLLOUT_TP_KEY,
            )
        )
        return out
    out.append(Finding("layout.rollout_tp", OK, f"rollout TP{tp}: {engines} engines over {world} ranks"))
    if tbs % world:
        out.append(
            Finding(
                "layout.rollout_batch",
                FAIL,
                f"train_batch_size {tbs} prompts is not divisible by the world {world}: verl dispatches "
                f"generation in equal chunks to every worker",
                "data.train_batch_size",
            )
        )
    else:
        out.append(
            Finding(
                "layout.rollout_batch",
                OK,
                f"train_batch_size x n / rollout DP = {tbs}x{n}/{engines} = {tbs * n // engines} sequences "
                f"per engine (max_num_seqs)",
            )
        )
    if get(cfg, f"{R}.name") == "vllm":
        out += vllm_dp_findings(ctx, model, world)
        max_len = max_model_len(cfg)
        try:
            limit, how = model_length_limit(model)
        except ValueError as e:
            limit, how = None, ""
            out.append(
                Finding("layout.rollout_model_len", FAIL, f"{e}: vLLM cannot derive its length limit", "config.json")
            )
        if limit is not None and max_len > limit:
            out.append(
                Finding(
                    "layout.rollout_model_len",
                    FAIL,
                    f"max_model_len {max_len} exceeds the model's length limit {limit} ({how}); vLLM refuses "
                    f"it at engine start",
                    f"data.max_response_length / {R}.max_model_len",
                )
            )
        out += engine_findings(cfg, engines)
    return out


# The declared patches that free the rollout's KV cache after every generate and rebuild it before the next
# with the first init's block count: what verl's dropped enforce_eager/free_cache_engine check protected.
KV_LIFECYCLE_PATCHES = (
    "verl.vllm_rollout_spmd.LLM.lifecycle",
    "vllm.v1.engine.core.EngineCore._initialize_kv_caches",
    "verl.vllm_rollout_spmd.vLLMRollout.__init__.a3_checks",
)


def engine_findings(cfg: Any, engines: int) -> list[Finding]:
    """The vLLM engine's settings (verl_patches.driver.rollout_settings): one FAIL per contradiction, else
    what the engine gets (graph mode and graph batch size, max_num_seqs, chunked prefill), and whether the
    patches that free and rebuild the KV cache every step are declared for the NPU."""

    problems = rollout_problems(cfg)
    out = [Finding("rollout.engine", FAIL, p, _keys_in(cfg, p)) for p in problems]
    if not problems:
        out.append(Finding("rollout.engine", OK, describe(cfg, engines)))
    declared = {p.name: p for p in all_patches()}
    missing = [n for n in KV_LIFECYCLE_PATCHES if n not in declared or "npu" not in declared[n].devices]
    if missing:
        out.append(
            Finding(
                "rollout.kv_cache_lifecycle",
                FAIL,
                f"patches not declared for the NPU: {missing}: the KV cache would not be freed and rebuilt every step",
                "verl_patches/patches",
            )
        )
    elif get(cfg, f"{R}.free_cache_engine", True):
        out.append(
            Finding(
                "rollout.kv_cache_lifecycle",
                OK,
                "KV cache freed after every generate and rebuilt before the next with the first init's "
                "block count (no sleep mode; patches " + ", ".join(KV_LIFECYCLE_PATCHES) + " at their pins: "
                "see the patches check)",
            )
        )
    return out


def _keys_in(cfg: Any, text: str) -> str:
    keys: list[str] = []
    for k in re.findall(r"[a-z_]+(?:\.[a-z_0-9]+)+", text):
        if k not in keys and get(cfg, k, _MISSING) is not _MISSING:
            keys.append(k)
    return " / ".join(keys)


def vllm_dp_findings(ctx: Context, model: Mapping[str, Any], world: int) -> list[Finding]:
    cfg, s = ctx.cfg, ctx.settings
    key = VLLM_DP_KEY
    dp = ctx.overlay.vllm_dp_size
    if dp is None:
        return [
            Finding(
                "layout.vllm_dp_size",
                FAIL,
                "the vLLM rollout needs overlay.vllm_dp_size (exported as VLLM_DP_SIZE)",
                key,
            )
        ]
    env = s.get("VLLM_DP_SIZE")
    if env is not None and env != str(dp):
        return [
            Finding(
                "layout.vllm_dp_size",
                FAIL,
                f"VLLM_DP_SIZE={env} ({s.where('VLLM_DP_SIZE')}) differs from {key}={dp}",
                f"VLLM_DP_SIZE / {key}",
            )
        ]
    try:
        rollout = rollout_of(cfg, world)
    except JobLayoutError as e:
        return [Finding("layout.vllm_dp_size", FAIL, str(e), e.key)]
    tp = rollout.tp
    lay = RolloutLayout(world_size=world, tp=tp, dp_per_instance=rollout.dp_per_instance)
    experts = int(model["n_routed_experts"])
    try:
        lay.owned_experts(lay.ep_size - 1, experts)
    except InvalidLayoutError as e:
        return [Finding("layout.vllm_dp_size", FAIL, str(e), key)]
    msg = (
        f"TP{tp} x VLLM_DP_SIZE {dp} = {lay.instance_size} ranks per instance -> {lay.num_instances} "
        f"instance(s), EP{lay.ep_size} ({experts // lay.ep_size} expert(s) per rank)"
    )
    if experts % lay.ep_size:
        return [
            Finding(
                "layout.vllm_dp_size",
                WARN,
                msg + f"; {experts} experts do not divide evenly: the last rank takes the remainder",
                key,
            )
        ]
    return [Finding("layout.vllm_dp_size", OK, msg)]


def fsdp_findings(ctx: Context, world: int) -> list[Finding]:
    cfg = ctx.cfg
    tbs, n = int(get(cfg, "data.train_batch_size")), int(get(cfg, f"{R}.n"))
    if (tbs * n) % world:
        return [
            Finding(
                "layout.batch_fsdp",
                FAIL,
                f"train_batch_size x n = {tbs * n} is not divisible by the world {world} (verl _validate_config)",
                "data.train_batch_size",
            )
        ]
    return [Finding("layout.batch_fsdp", OK, f"FSDP actor over {world} rank(s): {tbs * n // world} sequences each")]


def semantic_findings(cfg: Any) -> list[Finding]:
    """Our trainer's own config rules (verl_patches.driver.config_checks), one finding each."""

    out = []
    # reported by engine_findings as rollout.engine, and by the layout.* findings
    reported = set(rollout_problems(cfg)) | set(layout_problems(cfg))
    for problem in check_config(cfg):
        if problem in reported:
            continue
        out.append(Finding("config.semantic", FAIL, problem, _keys_in(cfg, problem)))
    if not out:
        out.append(
            Finding(
                "config.semantic",
                OK,
                "trainer config rules hold (old_log_prob skip preconditions, "
                "swap optimizer vs offload, layer list vs PP)",
            )
        )
    return out


_MISSING = object()


def layout_findings(ctx: Context, model: Mapping[str, Any]) -> tuple[list[Finding], MegatronLayout | None]:
    out = world_findings(ctx)
    try:
        world = cluster_of(ctx.cfg).world
    except JobLayoutError:  # world_findings named the key; nothing below can be judged without the world
        return out, None
    layout = None
    if ctx.megatron:
        found, layout = megatron_findings(ctx, model, world)
        out += found
    else:
        out += fsdp_findings(ctx, world)
    out += rollout_findings(ctx, model, world)
    out += semantic_findings(ctx.cfg)
    return out, layout
