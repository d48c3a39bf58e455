"""Which pipeline stages of a MoE model hold no MoE layer (pure).

A stage built only from dense layers owns no expert parameters, so it never joins the expert-parallel
gradient-norm reduction of the distributed optimizer that the other stages enter: the first
`update_actor` waits forever (seen over gloo with layers [1, 2] and one dense layer; the same code runs
over HCCL). The preflight (run by the launcher before anything starts) refuses such a split for training;
forward-only uses (the reference, check_logprobs) are unaffected.
"""

from __future__ import annotations


def stage_layer_ranges(counts: list[int]) -> list[range]:
    out, start = [], 0
    for c in counts:
        out.append(range(start, start + c))
        start += c
    return out


def dense_only_stages(counts: list[int], first_k_dense_replace: int, n_routed_experts: int) -> list[int]:
    """Indices of the stages whose layers are all dense (none when the model has no routed experts)."""
    if n_routed_experts <= 0 or len(counts) < 2:
        return []
    return [s for s, r in enumerate(stage_layer_ranges(counts)) if r.stop <= first_k_dense_replace]


def dense_only_message(counts: list[int], first_k_dense_replace: int, stages: list[int]) -> str:
    where = ", ".join(
        f"stage {s} (layers {r.start}..{r.stop - 1})"
        for s, r in zip(stages, (stage_layer_ranges(counts)[s] for s in stages))
    )
    return (
        f"layer list {counts}: {where} hold only dense layers (first_k_dense_replace="
        f"{first_k_dense_replace}); every pipeline stage of a MoE model needs at least one MoE layer, or the "
        f"distributed optimizer's expert gradient reduction waits for that stage forever: move layers so "
        f"that each stage reaches past layer {first_k_dense_replace - 1}"
    )
