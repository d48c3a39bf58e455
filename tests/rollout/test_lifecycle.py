"""E1/F1 lifecycle over GRPO-like steps on the CPU stand-in: generate -> free KV -> offload -> train ->
onload -> load weights -> init KV. The bytes the rollout holds (its weights', buffers' and KV cache's
storages, walked and summed) return to the pre-generation baseline after every free + offload; after
each weight load the rollout's log-probs equal the trained actor's (golden comparison). On the test-only
stand-in, which has the engine's attribute paths: the claim is the lifecycle's bookkeeping, in seconds;
over vllm-ascend's own runner and worker warm-up it is tests/rollout/test_graph_binding.py, and every step
of the tiny run."""

from __future__ import annotations

import pytest
import torch

from verl_patches.rollout.lifecycle import RolloutLifecycle, is_placeholder, model_runner_of, rebuild_mla


@pytest.fixture()
def llm(tiny_model_dir):
    from verl_patches.rollout.standin.engine import StandinLLM

    engine = StandinLLM(model=str(tiny_model_dir), max_model_len=24, max_num_seqs=16, seed=1)
    engine.sleep(level=1)  # as verl's vLLMRollout.__init__ does right after building: free KV + offload
    return engine


def actor_logprobs(actor: torch.nn.Module, prompt: list[int], response: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + response])
    logits = actor(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1)


def grpo_step(actor: torch.nn.Module, opt: torch.optim.Optimizer, prompts: list[list[int]], outputs) -> float:
    """One policy-gradient step with group-normalised rewards (reward: how many even tokens)."""
    losses = []
    for prompt, out in zip(prompts, outputs):
        rewards = torch.tensor([sum(t % 2 == 0 for t in c.token_ids) / max(1, len(c.token_ids)) for c in out.outputs])
        adv = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
        for a, c in zip(adv, out.outputs):
            losses.append(-(a * actor_logprobs(actor, prompt, list(c.token_ids)).sum()))
    loss = torch.stack(losses).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return float(loss.detach())


@pytest.mark.slow
def test_three_grpo_steps_order_and_bytes_back_to_baseline(llm, tiny_model_dir) -> None:
    from transformers import DeepseekV3ForCausalLM
    from vllm import SamplingParams

    actor = DeepseekV3ForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="eager").float()
    opt = torch.optim.SGD(actor.parameters(), lr=0.5)
    life = RolloutLifecycle(llm, device="cpu")
    events: list[str] = []
    baseline = life.device_bytes()  # built, KV freed, weights offloaded: before the first generation
    weight_bytes = sum(p.numel() * p.element_size() for p in actor.parameters())
    prompts = [[2, 5, 7], [2, 11, 13, 4]]
    params = SamplingParams(n=3, temperature=1.0, top_p=0.95, max_tokens=4, logprobs=0, seed=None)
    sums = []
    for step in range(3):
        life.onload_model_weights()
        events.append("onload")
        loaded = life.load_weights((n, p.detach()) for n, p in actor.state_dict().items())
        events.append("load")
        assert "model.layers.1.mlp.experts.w13_weight" in loaded and "model.layers.0.mlp.gate_up_proj.weight" in loaded
        life.init_cache_engine()
        events.append("init_kv")
        held = life.device_bytes()
        kv_bytes = sum(t.untyped_storage().nbytes() for t in model_runner_of(llm).kv_caches)
        assert kv_bytes > 0 and held >= baseline + kv_bytes + weight_bytes // 2  # weights + KV really held
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sampling_params=params, use_tqdm=False)
        events.append("generate")
        # Golden: the rollout's log-probs of what it sampled are the actor's (same weights after the load).
        for prompt, out in zip(prompts, outs):
            for c in out.outputs:
                got = torch.tensor([next(iter(d.values())).logprob for d in c.logprobs])
                want = actor_logprobs(actor, prompt, list(c.token_ids)).detach()
                torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        life.free_cache_engine()
        events.append("free_kv")
        life.offload_model_weights()
        events.append("offload")
        assert life.device_bytes() == baseline, f"step {step}: rollout still holds {life.device_bytes() - baseline} B"
        assert all(is_placeholder(p.data) for p in llm.llm_engine.model_executor.runner.model.parameters())
        grpo_step(actor, opt, prompts, outs)
        events.append("train")
        sums.append(sum(float(p.detach().sum()) for p in actor.parameters()))
    assert events == ["onload", "load", "init_kv", "generate", "free_kv", "offload", "train"] * 3
    assert len(set(sums)) == 3  # the actor really changed every step


def test_kv_cache_is_recreated_with_the_saved_configs(llm) -> None:
    life = RolloutLifecycle(llm, device="cpu")
    core = llm.llm_engine.engine_core.engine_core
    saved = core.kv_cache_configs
    shapes = []
    for _ in range(2):
        life.init_cache_engine()
        shapes.append([tuple(t.shape) for t in model_runner_of(llm).kv_caches])
        life.init_cache_engine()  # already there: no second allocation
        life.free_cache_engine()
        assert model_runner_of(llm).kv_caches == []
        assert all(
            layer.kv_cache[0].numel() == 0
            for layer in llm.llm_engine.vllm_config.compilation_config.static_forward_context.values()
        )
    assert shapes[0] == shapes[1] and core.kv_cache_configs is saved
    assert shapes[0][0][0] == saved[0].num_blocks * saved[0].kv_cache_groups[0].kv_cache_spec.block_size


def test_misordered_calls_fail_clearly(llm) -> None:
    from vllm import SamplingParams

    life = RolloutLifecycle(llm, device="cpu")
    with pytest.raises(RuntimeError, match="before onload_model_weights"):
        life.load_weights([])
    life.onload_model_weights()
    with pytest.raises(RuntimeError, match="KV cache is freed"):
        llm.generate([{"prompt_token_ids": [2, 3]}], SamplingParams(max_tokens=2))
    life.init_cache_engine()
    life.offload_model_weights()
    with pytest.raises(RuntimeError, match="weights are offloaded"):
        llm.generate([{"prompt_token_ids": [2, 3]}], SamplingParams(max_tokens=2))


def test_mla_absorbed_matrices_are_cleared_on_offload_and_rebuilt_from_the_new_kv_b_proj(llm, tiny_model_dir) -> None:
    from transformers import DeepseekV3ForCausalLM

    life = RolloutLifecycle(llm, device="cpu")
    model = llm.llm_engine.model_executor.runner.model
    impls = [layer.self_attn.mla_attn.impl for layer in model.layers]
    assert all(i.W_UV is None and i.W_UK_T is None for i in impls)  # cleared by the offload in sleep()
    actor = DeepseekV3ForCausalLM.from_pretrained(tiny_model_dir).float()
    life.onload_model_weights()
    life.load_weights((n, p.detach() * 2) for n, p in actor.state_dict().items())
    cfg = model.config
    for i, impl in enumerate(impls):
        kv_b = actor.model.layers[i].self_attn.kv_b_proj.weight.detach() * 2
        w = kv_b.view(cfg.num_attention_heads, cfg.qk_nope_head_dim + cfg.v_head_dim, cfg.kv_lora_rank)
        # vllm-ascend mla_v1.py: kv_b_proj.T viewed (L, N, P+V), split; W_UK_T = W_UK.permute(1, 2, 0) is
        # (N, P, L) and W_UV = W_UV.transpose(0, 1) is (N, L, V).
        torch.testing.assert_close(impl.W_UK_T, w[:, : cfg.qk_nope_head_dim, :])
        torch.testing.assert_close(impl.W_UV, w[:, cfg.qk_nope_head_dim :, :].transpose(1, 2))
    assert rebuild_mla(model) == cfg.num_hidden_layers
