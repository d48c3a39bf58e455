"""Test oracle: the MindSpeed-LLM v2.0.0 DeepSeek-V3 HF -> Megatron layout, on whole in-memory tensors.

Written independently of ``verl_patches.weights`` (which reads lazy slices): whole tensors, torch.chunk,
and the grouped-GEMM construction as MindSpeed-LLM's converter does it (per-expert ``cat(gate_t, up_t)``
transposed, all experts concatenated and *viewed* as ``[H, -1]``, then viewed back ``[E, H, -1]`` and
chunked over EP or EP x TP). It produces every rank's state dict of the whole model at once, which is
fine for the tiny test model.
"""

from __future__ import annotations

import torch


def stage_of(layer_list, layer):
    start = 0
    for pp, n in enumerate(layer_list):
        if start <= layer < start + n:
            return pp, layer - start
        start += n
    raise AssertionError(layer)


def reference_checkpoint(
    hf: dict, cfg: dict, tp: int, pp: int, ep: int, layer_list, grouped: bool, extend: bool
) -> dict:
    """``{(tp, pp, ep): state_dict}``."""
    H, E = cfg["hidden_size"], cfg["n_routed_experts"]
    L, dense = cfg["num_hidden_layers"], cfg["first_k_dense_replace"]
    layer_list = list(layer_list) if layer_list else [L // pp] * pp
    out = {(t, p, e): {} for t in range(tp) for p in range(pp) for e in range(ep)}

    def put_all(p, key, per_tp):
        for e in range(ep):
            for t in range(tp):
                out[(t, p, e)][key] = per_tp[t]

    emb = torch.chunk(hf["model.embed_tokens.weight"], tp, dim=0)
    put_all(0, "embedding.word_embeddings.weight", emb)
    for layer in range(L):
        p, i = stage_of(layer_list, layer)
        h = f"model.layers.{layer}."
        m = f"decoder.layers.{i}."
        rep = lambda x: [x] * tp  # noqa: E731
        put_all(p, m + "input_layernorm.weight", rep(hf[h + "input_layernorm.weight"]))
        put_all(p, m + "pre_mlp_layernorm.weight", rep(hf[h + "post_attention_layernorm.weight"]))
        qkv = torch.cat(
            [
                hf[h + "self_attn.q_a_proj.weight"].reshape(-1, H),
                hf[h + "self_attn.kv_a_proj_with_mqa.weight"].reshape(-1, H),
            ],
            dim=0,
        )
        put_all(p, m + "self_attention.linear_qkv.weight", rep(qkv))
        put_all(p, m + "self_attention.linear_proj.weight", torch.chunk(hf[h + "self_attn.o_proj.weight"], tp, dim=1))
        put_all(p, m + "self_attention.q_layernorm.weight", rep(hf[h + "self_attn.q_a_layernorm.weight"]))
        put_all(p, m + "self_attention.k_layernorm.weight", rep(hf[h + "self_attn.kv_a_layernorm.weight"]))
        put_all(p, m + "self_attention.linear_qb.weight", torch.chunk(hf[h + "self_attn.q_b_proj.weight"], tp, dim=0))
        put_all(p, m + "self_attention.linear_kvb.weight", torch.chunk(hf[h + "self_attn.kv_b_proj.weight"], tp, dim=0))

        def gate_up(gate, up, n):
            return [torch.cat(w, dim=0) for w in zip(torch.chunk(gate, n, dim=0), torch.chunk(up, n, dim=0))]

        if layer < dense:
            put_all(
                p,
                m + "mlp.linear_fc1.weight",
                gate_up(hf[h + "mlp.gate_proj.weight"], hf[h + "mlp.up_proj.weight"], tp),
            )
            put_all(p, m + "mlp.linear_fc2.weight", torch.chunk(hf[h + "mlp.down_proj.weight"], tp, dim=1))
            continue
        put_all(p, m + "mlp.router.weight", rep(hf[h + "mlp.gate.weight"]))
        put_all(p, m + "mlp.router.expert_bias", rep(hf[h + "mlp.gate.e_score_correction_bias"]))
        put_all(
            p,
            m + "mlp.shared_experts.linear_fc1.weight",
            gate_up(hf[h + "mlp.shared_experts.gate_proj.weight"], hf[h + "mlp.shared_experts.up_proj.weight"], tp),
        )
        put_all(
            p,
            m + "mlp.shared_experts.linear_fc2.weight",
            torch.chunk(hf[h + "mlp.shared_experts.down_proj.weight"], tp, dim=1),
        )
        etp = 1 if extend else tp
        fc1, fc2 = [], []
        for x in range(E):
            g, u = hf[h + f"mlp.experts.{x}.gate_proj.weight"], hf[h + f"mlp.experts.{x}.up_proj.weight"]
            fc1.append(torch.cat(gate_up(g, u, etp), dim=0))  # [2f, H]
            fc2.append(hf[h + f"mlp.experts.{x}.down_proj.weight"])  # [H, f]
        if grouped:
            gemm1 = torch.cat([w.t() for w in fc1]).view(H, -1)
            gemm2 = torch.cat([w.t() for w in fc2]).view(-1, H)
            if extend:
                c1 = torch.chunk(gemm1.view(E, H, -1), ep * tp, dim=0)
                c2 = torch.chunk(gemm2.view(E, -1, H), ep * tp, dim=0)
                for e in range(ep):
                    for t in range(tp):
                        out[(t, p, e)][m + "mlp.experts.weight1"] = c1[e * tp + t].reshape(H, -1)
                        out[(t, p, e)][m + "mlp.experts.weight2"] = c2[e * tp + t].reshape(-1, H)
            else:
                c1 = torch.chunk(gemm1.view(E, H, -1), ep, dim=0)
                c2 = torch.chunk(gemm2.view(E, -1, H), ep, dim=0)
                for e in range(ep):
                    w1 = torch.chunk(c1[e], tp, dim=2)
                    w2 = torch.chunk(c2[e], tp, dim=1)
                    for t in range(tp):
                        out[(t, p, e)][m + "mlp.experts.weight1"] = w1[t].reshape(H, -1)
                        out[(t, p, e)][m + "mlp.experts.weight2"] = w2[t].reshape(-1, H)
        else:
            n_local = E // ep
            for e in range(ep):
                for j in range(n_local):
                    x = e * n_local + j
                    a = torch.chunk(fc1[x], tp, dim=0)
                    b = torch.chunk(fc2[x], tp, dim=1)
                    for t in range(tp):
                        out[(t, p, e)][m + f"mlp.experts.local_experts.{j}.linear_fc1.weight"] = a[t]
                        out[(t, p, e)][m + f"mlp.experts.local_experts.{j}.linear_fc2.weight"] = b[t]
    put_all(pp - 1, "decoder.final_layernorm.weight", [hf["model.norm.weight"]] * tp)
    put_all(pp - 1, "output_layer.weight", torch.chunk(hf["lm_head.weight"], tp, dim=0))
    return out
