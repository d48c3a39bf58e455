"""The CPU stand-in's model and sampler: vLLM's parameter names and shapes (from vLLM's own loader and
mapping helpers), EP-local experts only, names vLLM would reject are rejected, logits equal the HF
model's, and SamplingParams semantics (greedy, top-k, top-p, n, max_tokens, stop, sampled logprobs)."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_config
from verl_patches.rollout.standin import weights
from verl_patches.rollout.standin.model import StandinDeepseekV3, StandinError
from verl_patches.rollout.standin.sampler import sample


@pytest.fixture(scope="module")
def ref():
    from transformers import DeepseekV3ForCausalLM

    torch.manual_seed(0)
    return DeepseekV3ForCausalLM(tiny_config()).eval()


def test_names_and_shapes_are_vllms(ref) -> None:
    cfg = ref.config
    m = StandinDeepseekV3(cfg)
    names = dict((n, tuple(p.shape)) for n, p in m.named_parameters())
    moe = f"model.layers.{cfg.first_k_dense_replace}.mlp"
    i, h = cfg.moe_intermediate_size, cfg.hidden_size
    assert names[f"{moe}.experts.w13_weight"] == (cfg.n_routed_experts, 2 * i, h)
    assert names[f"{moe}.experts.w2_weight"] == (cfg.n_routed_experts, h, i)
    assert f"{moe}.gate.e_score_correction_bias" in names and f"{moe}.shared_experts.gate_up_proj.weight" in names
    assert names["model.layers.0.mlp.gate_up_proj.weight"] == (2 * cfg.intermediate_size, h)
    assert not any(
        ".experts.0." in n or "gate_proj" in n or "up_proj.weight" in n and "gate_up" not in n for n in names
    )
    assert weights.stacked_params_mapping() == (("gate_up_proj", "gate_proj", 0), ("gate_up_proj", "up_proj", 1))


def test_vllms_loader_fills_it_and_logits_match_hf(ref) -> None:
    m = StandinDeepseekV3(ref.config)
    loaded = m.load_weights((n, t.detach().clone()) for n, t in ref.state_dict().items())
    assert loaded == {n for n, _ in m.named_parameters()}
    x = torch.randint(3, ref.config.vocab_size, (2, 6))
    with torch.no_grad():
        torch.testing.assert_close(m(x).logits, ref(x).logits, rtol=0, atol=0)


def test_ep_rank_holds_only_its_experts_and_skips_the_others(ref) -> None:
    from vllm.model_executor.layers.fused_moe.layer import determine_expert_map

    cfg = ref.config
    m = StandinDeepseekV3(cfg, ep_size=2, ep_rank=1)
    _, expert_map = determine_expert_map(2, 1, cfg.n_routed_experts)
    assert m.experts == [e for e in range(cfg.n_routed_experts) if expert_map[e] >= 0]
    moe = f"model.layers.{cfg.first_k_dense_replace}.mlp.experts"
    assert m.get_parameter(f"{moe}.w13_weight").shape[0] == len(m.experts) == cfg.n_routed_experts // 2
    m.load_weights((n, t.detach().clone()) for n, t in ref.state_dict().items())
    first = m.experts[0]
    torch.testing.assert_close(
        m.get_parameter(f"{moe}.w2_weight")[0], ref.get_parameter(f"{moe}.{first}.down_proj.weight")
    )
    with pytest.raises(StandinError, match="EP size 1 only"):
        m(torch.tensor([[3, 4]]))


def test_names_or_shapes_vllm_rejects_are_rejected(ref) -> None:
    m = StandinDeepseekV3(ref.config)
    with pytest.raises(StandinError, match="does not accept the weight name"):
        m.load_weights([("model.layers.0.self_attn.not_a_param.weight", torch.zeros(1))])
    bad = ref.model.layers[0].mlp.gate_proj.weight.detach()[:-1]
    with pytest.raises(StandinError, match="expects shape"):
        m.load_weights([("model.layers.0.mlp.gate_proj.weight", bad)])
    m.load_weights([("model.layers.0.self_attn.o_proj.module.weight", torch.zeros(1))])  # vllm-ascend drops ".module."


def test_sampler_semantics() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]] * 2000)
    g = torch.Generator().manual_seed(0)
    tok, lp = sample(logits, 0.0, -1, 1.0, g)
    assert (tok == 1).all()
    torch.testing.assert_close(lp, torch.log_softmax(logits, -1)[:, 1])
    tok, _ = sample(logits, 1.0, 2, 1.0, g)  # top-k 2: only tokens 1 and 3
    assert set(tok.tolist()) == {1, 3}
    p = torch.softmax(logits[0], -1)  # top-p just above p(1): token 1 alone is not enough, 1 and 3 are
    tok, lp = sample(logits, 1.0, -1, float(p[1]) + 1e-3, g)
    assert set(tok.tolist()) == {1, 3}
    torch.testing.assert_close(lp, torch.log_softmax(logits, -1).gather(-1, tok.unsqueeze(-1)).squeeze(-1))
    tok, _ = sample(logits, 1.0, -1, 1.0, g)
    assert set(tok.tolist()) == {0, 1, 2, 3}
    counts = torch.bincount(tok, minlength=4).float() / len(tok)
    torch.testing.assert_close(counts, p, atol=0.04, rtol=0)


def test_sampler_reports_log_probs_at_the_sampling_temperature_before_truncation() -> None:
    """The actor scores log_softmax(logits / T) (C3); top-k/top-p change what is drawn, not what is reported."""
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]] * 500)
    g = torch.Generator().manual_seed(0)
    for t, top_k, top_p in [(0.7, -1, 1.0), (0.9, 2, 1.0), (1.3, -1, 0.8)]:
        tok, lp = sample(logits, t, top_k, top_p, g)
        want = torch.log_softmax(logits / t, -1).gather(-1, tok.unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(lp, want)
        assert not torch.allclose(lp, torch.log_softmax(logits, -1).gather(-1, tok.unsqueeze(-1)).squeeze(-1))


def test_generate_n_max_tokens_stop_and_logprobs(tiny_model_dir) -> None:
    from vllm import SamplingParams

    from verl_patches.rollout.standin.engine import StandinLLM

    llm = StandinLLM(model=str(tiny_model_dir), max_model_len=24, max_num_seqs=4, seed=3)
    outs = llm.generate(
        [{"prompt_token_ids": [2, 5]}, {"prompt_token_ids": [2, 7, 8]}],
        SamplingParams(n=3, temperature=1.0, max_tokens=4, logprobs=0, ignore_eos=True),
    )
    assert [len(o.outputs) for o in outs] == [3, 3] and [o.prompt_token_ids for o in outs] == [[2, 5], [2, 7, 8]]
    for o in outs:
        for c in o.outputs:
            assert len(c.token_ids) == 4 and c.finish_reason == "length"
            assert [list(d) for d in c.logprobs] == [[t] for t in c.token_ids]
            assert c.cumulative_logprob == pytest.approx(sum(next(iter(d.values())).logprob for d in c.logprobs))
    eos = llm.eos_token_id
    stop = llm.generate(
        [{"prompt_token_ids": [2, 5]}], SamplingParams(temperature=1.0, max_tokens=6, stop_token_ids=list(range(48)))
    )
    assert stop[0].outputs[0].finish_reason == "stop" and len(stop[0].outputs[0].token_ids) == 1
    assert stop[0].outputs[0].logprobs is None and eos == 1
