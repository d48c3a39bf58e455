"""Preflight: HCCL_BUFFSIZE against what MC2 needs on A3 at the profile's sizes (the rules: `mc2_buffer`).

vllm-ascend 0.9.1 decodes through MC2 (`npu_moe_distribute_dispatch_v2` / `combine_v2`) when the instance's
expert parallelism is 16 or more and no rank holds a prefill (ascend_forward_context.get_fused_moe_state): the
A3 profiles' graph decodes. A window (HCCL_BUFFSIZE per communicator) smaller than the documented rule fails
there, on 256 dies, after the model is loaded; here it is one line naming HCCL_BUFFSIZE, the MB it needs and
the sizes it follows from.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from verl_patches.base.overlay_settings import VLLM_DP_KEY
from verl_patches.base.strict_int import IntError, parse_int
from verl_patches.launch.preflight.findings import FAIL, OK, Context, Finding, get
from verl_patches.launch.preflight.layout import R
from verl_patches.launch.preflight.mc2_buffer import A3_MAX_BS, required_buffsize_mb
from verl_patches.launch.preflight.memory import hccl_buffsize_setting, rollout_setup
from verl_patches.launch.preflight.memory_estimate import rollout_mc2_sizes
from verl_patches.reshard.model_dims import ModelDims

CHECK = "rollout.mc2_hccl_buffsize"
MC2_MIN_EP = 16  # ascend_forward_context.get_fused_moe_state: below it vllm-ascend routes through All2All


def mc2_buffer_findings(ctx: Context, model: Mapping[str, Any]) -> list[Finding]:
    """One finding: whether HCCL_BUFFSIZE holds MC2's window for the largest decode batch one rank dispatches."""
    cfg = ctx.cfg
    if get(cfg, f"{R}.name") != "vllm" or not model.get("n_routed_experts"):
        return []
    if not ctx.cluster_profile:
        return [Finding(CHECK, OK, "n/a: this profile's rollout runs without HCCL (no A3 dies)")]
    m, r = ModelDims.from_hf_config(model), rollout_setup(cfg)
    if r.ep < MC2_MIN_EP:
        return [Finding(CHECK, OK, f"n/a: EP{r.ep} < {MC2_MIN_EP}: vllm-ascend routes the MoE by All2All, not MC2")]
    raw, where = hccl_buffsize_setting(ctx.settings)
    try:
        have = parse_int(raw, f"HCCL_BUFFSIZE ({where})", minimum=1)
    except IntError as e:
        return [Finding(CHECK, FAIL, f"{e}: MB per HCCL communicator", "HCCL_BUFFSIZE")]
    sizes = rollout_mc2_sizes(m, r)
    origin = (
        f"{r.decode_tokens} decode tokens per DP rank (max_num_seqs / graph batch) over rollout TP{r.tp}: "
        f"{sizes.describe()}"
    )
    problems = []
    if sizes.bs > A3_MAX_BS:
        problems.append(
            Finding(
                CHECK,
                FAIL,
                f"MC2 dispatches at most {A3_MAX_BS} tokens per rank on A3, this profile {sizes.bs} ({origin})",
                f"{R}.max_num_seqs",
            )
        )
    if m.num_experts % r.ep:
        problems.append(
            Finding(
                CHECK,
                FAIL,
                f"MC2 needs the {m.num_experts} routed experts to divide evenly over EP{r.ep} (moe_expert_num % "
                f"ep_world_size == 0)",
                VLLM_DP_KEY,
            )
        )
    need, rule = required_buffsize_mb(sizes)
    text = f"HCCL_BUFFSIZE={have} MB ({where}); MC2 needs {need} MB by {rule} for {origin}"
    if have < need:
        problems.append(Finding(CHECK, FAIL, f"{text}: set HCCL_BUFFSIZE={need} or more (env file)", "HCCL_BUFFSIZE"))
    return problems or [Finding(CHECK, OK, text)]
