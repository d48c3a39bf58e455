"""Parameter names of MindSpeed-LLM's DeepSeek-V3 (Megatron core) and of Hugging Face, as one table.

The same table drives the offline checkpoint converters (with a layout *kind* per entry, see
``tensor_layout``) and the runtime Megatron -> HF name map used when training weights are synced into the
rollout engine (vendor item G10). Layer names are relative to ``decoder.layers.{L}.`` (Megatron) and
``model.layers.{L}.`` (HF); at runtime ``L`` is the global layer index (verl normalises the per-stage
index before naming).

| Megatron (``decoder.layers.L.`` ...) | HF (``model.layers.L.`` ...)                                    | kind        |
|--------------------------------------|-----------------------------------------------------------------|-------------|
| input_layernorm.weight               | input_layernorm.weight                                          | replicated  |
| self_attention.linear_qkv.weight     | self_attn.q_a_proj.weight, self_attn.kv_a_proj_with_mqa.weight  | concat_rows |
| self_attention.q_layernorm.weight    | self_attn.q_a_layernorm.weight                                  | replicated  |
| self_attention.k_layernorm.weight    | self_attn.kv_a_layernorm.weight                                 | replicated  |
| self_attention.linear_qb.weight      | self_attn.q_b_proj.weight                                       | tp_rows     |
| self_attention.linear_kvb.weight     | self_attn.kv_b_proj.weight                                      | tp_rows     |
| self_attention.linear_proj.weight    | self_attn.o_proj.weight                                         | tp_cols     |
| pre_mlp_layernorm.weight             | post_attention_layernorm.weight                                 | replicated  |
| mlp.linear_fc1.weight (dense layers) | mlp.gate_proj.weight, mlp.up_proj.weight                        | gate_up     |
| mlp.linear_fc2.weight (dense layers) | mlp.down_proj.weight                                            | tp_cols     |
| mlp.router.weight                    | mlp.gate.weight                                                 | replicated  |
| mlp.router.expert_bias               | mlp.gate.e_score_correction_bias                                | replicated  |
| mlp.shared_experts.linear_fc1.weight | mlp.shared_experts.gate_proj.weight, ...up_proj.weight          | gate_up     |
| mlp.shared_experts.linear_fc2.weight | mlp.shared_experts.down_proj.weight                             | tp_cols     |
| mlp.experts.weight1 (grouped GEMM)   | mlp.experts.{e}.gate_proj.weight, ...up_proj.weight for every e | grouped_w1  |
| mlp.experts.weight2 (grouped GEMM)   | mlp.experts.{e}.down_proj.weight for every e                    | grouped_w2  |
| mlp.experts.local_experts.{j}.linear_fc1.weight | mlp.experts.{e}.gate_proj.weight, ...up_proj.weight  | gate_up     |
| mlp.experts.local_experts.{j}.linear_fc2.weight | mlp.experts.{e}.down_proj.weight                     | tp_cols     |

Outside the layers: ``embedding.word_embeddings.weight`` <-> ``model.embed_tokens.weight`` (vocab rows),
``decoder.final_layernorm.weight`` <-> ``model.norm.weight``, ``output_layer.weight`` <-> ``lm_head.weight``
(vocab rows).

The runtime map of ``weight1`` returns ``2 * num_experts`` names ordered expert by expert, gate then up
(``experts.0.gate_proj, experts.0.up_proj, experts.1.gate_proj, ...``), and ``weight2`` returns
``num_experts`` down_proj names: the order in which the rollout reshard hands over per-expert tensors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MCORE_LAYER = "decoder.layers.{layer}."
HF_LAYER = "model.layers.{layer}."


@dataclass(frozen=True)
class NameRule:
    mcore: str  # full name (global rules) or suffix after the layer prefix; may hold {expert}
    hf: tuple[str, ...]  # the HF tensors that make up the Megatron one, in concatenation order
    kind: str  # layout kind, see tensor_layout
    per_expert: bool = False  # hf names are expanded over every routed expert (grouped GEMM)


GLOBAL_PRE = (NameRule("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), "tp_rows"),)
GLOBAL_POST = (
    NameRule("decoder.final_layernorm.weight", ("model.norm.weight",), "replicated"),
    NameRule("output_layer.weight", ("lm_head.weight",), "tp_rows"),
)
ATTENTION = (
    NameRule("input_layernorm.weight", ("input_layernorm.weight",), "replicated"),
    NameRule(
        "self_attention.linear_qkv.weight",
        ("self_attn.q_a_proj.weight", "self_attn.kv_a_proj_with_mqa.weight"),
        "concat_rows",
    ),
    NameRule("self_attention.q_layernorm.weight", ("self_attn.q_a_layernorm.weight",), "replicated"),
    NameRule("self_attention.k_layernorm.weight", ("self_attn.kv_a_layernorm.weight",), "replicated"),
    NameRule("self_attention.linear_qb.weight", ("self_attn.q_b_proj.weight",), "tp_rows"),
    NameRule("self_attention.linear_kvb.weight", ("self_attn.kv_b_proj.weight",), "tp_rows"),
    NameRule("self_attention.linear_proj.weight", ("self_attn.o_proj.weight",), "tp_cols"),
    NameRule("pre_mlp_layernorm.weight", ("post_attention_layernorm.weight",), "replicated"),
)
DENSE_MLP = (
    NameRule("mlp.linear_fc1.weight", ("mlp.gate_proj.weight", "mlp.up_proj.weight"), "gate_up"),
    NameRule("mlp.linear_fc2.weight", ("mlp.down_proj.weight",), "tp_cols"),
)
MOE_SHARED = (
    NameRule("mlp.router.weight", ("mlp.gate.weight",), "replicated"),
    NameRule("mlp.router.expert_bias", ("mlp.gate.e_score_correction_bias",), "replicated"),
    NameRule(
        "mlp.shared_experts.linear_fc1.weight",
        ("mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight"),
        "gate_up",
    ),
    NameRule("mlp.shared_experts.linear_fc2.weight", ("mlp.shared_experts.down_proj.weight",), "tp_cols"),
)
GROUPED_EXPERTS = (
    NameRule(
        "mlp.experts.weight1",
        ("mlp.experts.{expert}.gate_proj.weight", "mlp.experts.{expert}.up_proj.weight"),
        "grouped_w1",
        True,
    ),
    NameRule("mlp.experts.weight2", ("mlp.experts.{expert}.down_proj.weight",), "grouped_w2", True),
)
LOCAL_EXPERTS = (
    NameRule(
        "mlp.experts.local_experts.{expert}.linear_fc1.weight",
        ("mlp.experts.{expert}.gate_proj.weight", "mlp.experts.{expert}.up_proj.weight"),
        "gate_up",
    ),
    NameRule(
        "mlp.experts.local_experts.{expert}.linear_fc2.weight", ("mlp.experts.{expert}.down_proj.weight",), "tp_cols"
    ),
)


def layer_rules(is_moe: bool, grouped_gemm: bool = True) -> tuple[NameRule, ...]:
    """The rules of one decoder layer (dense MLP before ``first_k_dense_replace``, MoE after)."""
    if not is_moe:
        return ATTENTION + DENSE_MLP
    return ATTENTION + MOE_SHARED + (GROUPED_EXPERTS if grouped_gemm else LOCAL_EXPERTS)


def _template_regex(template: str) -> re.Pattern[str]:
    pat = re.escape(template).replace(re.escape("{expert}"), r"(?P<expert>\d+)")
    return re.compile(pat + "$")


_LAYER_RULES = ATTENTION + DENSE_MLP + MOE_SHARED + GROUPED_EXPERTS + LOCAL_EXPERTS
_MCORE_LAYER_RE = re.compile(r"^decoder\.layers\.(?P<layer>\d+)\.(?P<rest>.+)$")
_HF_LAYER_RE = re.compile(r"^model\.layers\.(?P<layer>\d+)\.(?P<rest>.+)$")
_MCORE_RULE_RES = [(r, _template_regex(r.mcore)) for r in _LAYER_RULES]
_HF_RULE_RES = [(r, i, _template_regex(h)) for r in _LAYER_RULES if r not in LOCAL_EXPERTS for i, h in enumerate(r.hf)]


class UnknownNameError(KeyError):
    """A parameter name that is not part of the DeepSeek-V3 mapping."""


def mcore_to_hf_names(name: str, num_experts: int | None = None) -> list[str]:
    """HF names that the Megatron tensor ``name`` splits into, in concatenation order.

    ``num_experts`` is needed for ``mlp.experts.weight1/weight2`` (grouped GEMM): they expand to every
    routed expert. ``local_experts.{j}`` is taken to carry the global expert index ``j``.
    """
    for rule in GLOBAL_PRE + GLOBAL_POST:
        if name == rule.mcore:
            return list(rule.hf)
    m = _MCORE_LAYER_RE.match(name)
    if m:
        layer, rest = m.group("layer"), m.group("rest")
        prefix = HF_LAYER.format(layer=layer)
        for rule, rx in _MCORE_RULE_RES:
            mm = rx.match(rest)
            if not mm:
                continue
            if rule.per_expert:
                if num_experts is None:
                    raise ValueError(f"{name!r}: num_experts is needed to name the experts of a grouped GEMM weight")
                return [prefix + h.format(expert=e) for e in range(num_experts) for h in rule.hf]
            expert = mm.groupdict().get("expert")
            return [prefix + h.format(expert=expert) for h in rule.hf]
    raise UnknownNameError(f"{name!r} is not a MindSpeed-LLM DeepSeek-V3 parameter name")


def hf_to_mcore_name(name: str, grouped_gemm: bool = True) -> tuple[str, int]:
    """``(megatron_name, position)``: the Megatron tensor holding HF ``name`` and its place among the HF
    names of that tensor (for grouped ``weight1`` the place of expert ``e``'s gate is ``2e``, up ``2e+1``)."""
    for rule in GLOBAL_PRE + GLOBAL_POST:
        if name in rule.hf:
            return rule.mcore, rule.hf.index(name)
    m = _HF_LAYER_RE.match(name)
    if m:
        layer, rest = m.group("layer"), m.group("rest")
        prefix = MCORE_LAYER.format(layer=layer)
        for rule, pos, rx in _HF_RULE_RES:
            mm = rx.match(rest)
            if not mm:
                continue
            if rule.per_expert:
                e = int(mm.group("expert"))
                if not grouped_gemm:
                    local = next(r for r in LOCAL_EXPERTS if r.hf[pos : pos + 1] == rule.hf[pos : pos + 1])
                    return prefix + local.mcore.format(expert=e), pos
                return prefix + rule.mcore, e * len(rule.hf) + pos
            return prefix + rule.mcore, pos
    raise UnknownNameError(f"{name!r} is not a DeepSeek-V3 Hugging Face parameter name")


def layer_rule_for(suffix: str) -> tuple[NameRule, int | None]:
    """The rule of a Megatron layer-parameter suffix (after ``decoder.layers.L.``) and its expert index."""
    for rule, rx in _MCORE_RULE_RES:
        mm = rx.match(suffix)
        if mm:
            e = mm.groupdict().get("expert")
            return rule, (int(e) if e is not None else None)
    raise UnknownNameError(f"{suffix!r} is not a MindSpeed-LLM DeepSeek-V3 layer parameter")


def split_layer_name(name: str, prefix: str = "decoder.layers.") -> tuple[int, str] | None:
    """``("decoder.layers.7.x.y")`` -> ``(7, "x.y")``; None for names outside the layers."""
    if not name.startswith(prefix):
        return None
    layer, _, rest = name[len(prefix) :].partition(".")
    return (int(layer), rest) if layer.isdigit() and rest else None
