"""Preflight ``validation``: how often the run validates, on how many test prompts, and what that costs.

A validation is one more generate, one greedy response per prompt (verl's ``val_kwargs``), plus the weight
switch before it. Its time is set by the decode steps of the longest response, as a training rollout's is, as
long as every rollout engine holds its share of the prompts in one batch (``max_num_seqs``); each further batch
adds about one rollout phase. The cost is stated against the vendor's step table (`run_costs.VENDOR_STEPS`)
for the layouts the vendor ran, and as a count of batches otherwise.
"""

from __future__ import annotations

import math

from verl_patches.data.val_subset import VAL_MAX_PROMPTS_KEY
from verl_patches.launch.preflight.files import parquet_rows
from verl_patches.launch.preflight.findings import OK, WARN, Context, Finding, get
from verl_patches.launch.preflight.run_costs import VENDOR_SOURCE, vendor_step

TEST_FREQ_KEY = "trainer.test_freq"


def validation_findings(ctx: Context) -> list[Finding]:
    check = "validation"
    freq = int(get(ctx.cfg, TEST_FREQ_KEY, -1) or -1)
    before = bool(get(ctx.cfg, "trainer.val_before_train", False))
    bound = ctx.overlay.val_max_prompts
    if freq <= 0 and not before:
        if ctx.cluster_profile:
            return [
                Finding(
                    check,
                    WARN,
                    f"validation off ({TEST_FREQ_KEY}={freq}, trainer.val_before_train=False): no held-out accuracy "
                    f"to tell a healthy run (the A3 profiles validate every 10 steps)",
                    TEST_FREQ_KEY,
                )
            ]
        return [Finding(check, OK, f"validation off ({TEST_FREQ_KEY}={freq})")]
    when = " and ".join(
        w
        for w in ("before training" if before else "", f"every {freq} steps (and at the last)" if freq > 0 else "")
        if w
    )
    rows = parquet_rows(ctx, "data.val_files")
    if bound is None or (rows is not None and rows <= bound):
        prompts = rows
        which = f"the whole test split ({rows} prompts)" if rows is not None else "the whole test split"
    elif rows is None:
        prompts = bound
        which = f"at most {bound} prompts of the test split ({VAL_MAX_PROMPTS_KEY}, a fixed seeded sample)"
    else:
        prompts = bound
        which = f"{bound} of the test split's {rows} prompts ({VAL_MAX_PROMPTS_KEY}, a fixed seeded sample)"
    text = f"validation {when} ({TEST_FREQ_KEY}={freq}) on {which}, one greedy response each"
    if prompts is None:
        return [Finding(check, OK, text + "; its size is read on the cluster's storage")]
    if ctx.layout is None:
        return [Finding(check, WARN, text + "; its batches per engine need the layout, refused (see layout.*)")]
    engines = ctx.layout.rollout.dp
    seqs = int(get(ctx.cfg, "actor_rollout_ref.rollout.max_num_seqs") or 0)
    batches = math.ceil(math.ceil(prompts / engines) / seqs) if seqs > 0 else 1
    text += (
        f": {math.ceil(prompts / engines)} per rollout engine of {engines}, {batches} batch(es) of max_num_seqs {seqs}"
    )
    vendor = vendor_step(ctx.overlay.profile)
    if vendor is not None:
        cost = batches * vendor.rollout_s + vendor.switch_s
        share = f", {cost / (freq * vendor.step_s):.1%} of the {freq} steps between validations" if freq > 0 else ""
        text += (
            f"; each costs about {cost:.0f} s ({batches} x {vendor.rollout_s} s generation + {vendor.switch_s} s "
            f"weight switch, {VENDOR_SOURCE}){share}"
        )
    status, key = (WARN, VAL_MAX_PROMPTS_KEY) if batches > 1 and ctx.cluster_profile else (OK, "")
    if status == WARN:
        text += f"; more than one batch: lower {VAL_MAX_PROMPTS_KEY} to {engines * seqs} or fewer"
    return [Finding(check, status, text, key)]


__all__ = ["validation_findings"]
