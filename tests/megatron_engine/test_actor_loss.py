"""C3 behaviour of our MegatronPPOActor on one gloo rank: tempered log-probs and entropy, the skipped
old-log-prob pass (ratio exactly 1, REINFORCE gradient), and the refusals (no temperature, packed sequences).

The model is a toy with verl's model surface (``pre_process``/``post_process``, a Megatron config) whose
logits depend only on the current token, so the reference is a direct computation; the Megatron schedule,
verl's vocab-parallel log-probs and our forward (G11) are the real ones. The full model is in the golden test.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from verl_patches.multirank import run_ranks

VOCAB, HIDDEN, B, P, R = 16, 8, 4, 3, 4


class ToyModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        from megatron.core.enums import ModelType
        from megatron.core.transformer.transformer_config import TransformerConfig

        self.config = TransformerConfig(
            num_layers=1, hidden_size=HIDDEN, num_attention_heads=1, use_cpu_initialization=True
        )
        self.pre_process = self.post_process = True
        self.model_type = ModelType.encoder_or_decoder
        g = torch.Generator().manual_seed(0)
        self.emb = torch.nn.Parameter(torch.randn(VOCAB, HIDDEN, generator=g))
        self.out = torch.nn.Parameter(torch.randn(VOCAB, HIDDEN, generator=g))

    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.emb[input_ids]) @ self.out.t()

    def forward(self, input_ids, attention_mask, position_ids):  # [B, S] -> [B, S, V]
        assert attention_mask.dtype == torch.bool and attention_mask.shape[1] == 1  # the NPU-FA mask (G11)
        return self.logits(input_ids)

    def set_input_tensor(self, tensor) -> None:
        pass

    def finish_grad_sync(self) -> None:
        pass

    def zero_grad_buffer(self) -> None:
        self.zero_grad(set_to_none=True)


class StubOptimizer:
    param_groups = [{"lr": 0.0}]

    def zero_grad(self) -> None:
        pass

    def step(self):
        return True, 0.0, None


def make_batch() -> object:
    from verl import DataProto

    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(1, VOCAB, (B, P + R), generator=g)
    attention_mask = torch.ones(B, P + R, dtype=torch.long)
    attention_mask[0, :2] = 0  # left padding of a prompt
    attention_mask[1, -1] = 0  # a response that ended early
    input_ids[attention_mask == 0] = 0
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    adv = torch.randn(B, generator=g)[:, None].expand(B, R).contiguous()
    return DataProto.from_dict(
        tensors={
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "responses": input_ids[:, -R:].clone(),
            "advantages": adv,
        }
    )


def make_actor(model: ToyModel, **overrides):
    from omegaconf import open_dict
    from verl.workers.actor.megatron_actor import MegatronPPOActor

    from verl_patches.trainer.config_compose import compose_config

    cfg = compose_config("ppo_mindspeed_trainer", []).actor_rollout_ref.actor
    with open_dict(cfg):
        cfg.megatron.tensor_model_parallel_size = 1
        cfg.ppo_mini_batch_size = B
        cfg.use_kl_loss = False
        for k, v in overrides.items():
            cfg[k] = v
    hf = SimpleNamespace(architectures=["DeepseekV3ForCausalLM"])
    return MegatronPPOActor(
        config=cfg,
        model_config=hf,
        hf_config=hf,
        tf_config=model.config,
        actor_module=[model],
        actor_optimizer=StubOptimizer(),
    )


def reference_log_probs(model: ToyModel, batch, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    ids = batch.batch["input_ids"]
    logits = model.logits(ids[:, -R - 1 : -1]) / temperature
    logp = torch.log_softmax(logits, -1)
    lp = logp.gather(-1, batch.batch["responses"][..., None])[..., 0]
    ent = -(logp.exp() * logp).sum(-1)
    return lp, ent


def init_megatron_tp1() -> None:
    """Parallel state for one rank, with the process-wide CUDA->NPU remap every A3 worker runs under
    (MindSpeed imports it; here the NPU is the CPU emulation)."""
    import torch_npu.contrib.transfer_to_npu  # noqa: F401
    from megatron.core import parallel_state as mpu

    mpu.initialize_model_parallel(1, 1)


def scenario_tempered_log_probs(rank: int, world: int) -> dict:
    init_megatron_tp1()
    out = {}
    for temperature in (1.0, 0.7):
        torch.manual_seed(0)
        model = ToyModel()
        actor = make_actor(model, recompute_old_log_prob=True)
        batch = make_batch()
        batch.meta_info.update(temperature=temperature, micro_batch_size=2, use_dynamic_bsz=False)
        lp, ent = actor.compute_log_prob(batch, calculate_entropy=True)
        ref_lp, ref_ent = reference_log_probs(model, batch, temperature)
        mask = batch.batch["attention_mask"][:, -R:].bool()
        with torch.no_grad():
            out[str(temperature)] = [float((lp - ref_lp)[mask].abs().max()), float((ent - ref_ent)[mask].abs().max())]
            # the untempered log-probs differ: the temperature was really applied
            out[f"{temperature}-vs-T1"] = float((lp - reference_log_probs(model, batch, 1.0)[0])[mask].abs().max())
    return out


def scenario_skip_old_log_prob(rank: int, world: int) -> dict:
    from verl_patches.patches.verl.workers.actor.megatron_actor import NOT_RECOMPUTED, TemperatureMissing

    init_megatron_tp1()
    temperature = 0.9
    model = ToyModel()
    actor = make_actor(model, recompute_old_log_prob=False)
    batch = make_batch()
    batch.meta_info.update(temperature=temperature, micro_batch_size=2)
    old, ent = actor.compute_log_prob(batch, calculate_entropy=True)
    skipped = bool(old.abs().sum() == 0 and batch.meta_info.get(NOT_RECOMPUTED))

    keys = sorted(actor.make_minibatch_iterator(batch).__next__().batch.keys())
    batch.meta_info["micro_batch_size"] = 2
    model.zero_grad_buffer()
    metrics = actor.forward_backward_batch(batch, micro_batch_size=2)["output"]
    grads = [p.grad.clone() for p in (model.emb, model.out)]

    # REINFORCE: loss = mean over micro-batches of token-mean(-A * logp); ratio == 1 so nothing clips
    model.zero_grad(set_to_none=True)
    lp, _ = reference_log_probs(model, batch, temperature)
    mask = batch.batch["attention_mask"][:, -R:].float()
    adv = batch.batch["advantages"]
    loss = 0
    for s in (slice(0, 2), slice(2, 4)):
        loss = loss + (-adv[s] * lp[s] * mask[s]).sum() / mask[s].sum() / 2
    loss.backward()
    diff = max(float((a - b.grad).abs().max()) for a, b in zip(grads, (model.emb, model.out)))
    clipfrac = max(m[0]["actor/pg_clipfrac"][0] for m in metrics)
    ppo_kl = max(abs(m[0]["actor/ppo_kl"][0]) for m in metrics)

    batch.meta_info.pop("temperature")
    try:
        actor.forward_backward_batch(batch, micro_batch_size=2, forward_only=True)
        missing = "no error"
    except TemperatureMissing as e:
        missing = str(e)
    return {
        "skipped": skipped,
        "keys": keys,
        "grad_diff": diff,
        "clipfrac": clipfrac,
        "ppo_kl": ppo_kl,
        "missing": missing,
    }


def scenario_tis_through_the_actor(rank: int, world: int) -> dict:
    """The skipped old-log-prob pass with TIS at cap 2: rollout log-probs equal to the actor's own (the ones its
    forward computes, from compute_log_prob on the same micro-batches) change nothing; perturbed by a known Δ
    they weigh each token's REINFORCE term by min(exp(Δ), 2), and the actor reports the weights' metrics."""
    from verl_patches.patches.verl.workers.actor.rollout_correction import CAPPED_SHARE, WEIGHT_MEAN

    init_megatron_tp1()
    temperature = 0.9
    model = ToyModel()
    mask = make_batch().batch["attention_mask"][:, -R:]

    def grads(rollout: torch.Tensor | None, cap: float | None) -> tuple[list[torch.Tensor], dict]:
        actor = make_actor(model, recompute_old_log_prob=False, rollout_correction={"tis_cap": cap})
        batch = make_batch()
        if rollout is not None:
            batch.batch["rollout_log_probs"] = rollout
        batch.meta_info.update(temperature=temperature, micro_batch_size=2)
        keys = set(next(actor.make_minibatch_iterator(batch)).batch.keys())
        assert ("rollout_log_probs" in keys) == (rollout is not None)  # selected for the update's forward
        model.zero_grad_buffer()
        out = actor.forward_backward_batch(batch, micro_batch_size=2)["output"]
        return [p.grad.clone() for p in (model.emb, model.out)], [m[0] for m in out]

    measuring = make_actor(model, recompute_old_log_prob=True)
    batch = make_batch()
    batch.meta_info.update(temperature=temperature, micro_batch_size=2, use_dynamic_bsz=False)
    own, _ = measuring.compute_log_prob(batch)
    own = torch.where(mask.bool(), own, torch.full_like(own, -1.0))  # the rollout pads with -1
    plain, _ = grads(None, None)
    same, same_metrics = grads(own.clone(), 2.0)

    g = torch.Generator().manual_seed(7)
    delta = torch.rand(B, R, generator=g) * 2.0 - 0.5  # -0.5 .. 1.5 nats: some weights capped at 2
    perturbed, metrics = grads(own - delta, 2.0)
    w = torch.clamp(torch.exp(delta), max=2.0)
    model.zero_grad(set_to_none=True)
    lp, _ = reference_log_probs(model, batch, temperature)
    m = mask.float()
    adv = batch.batch["advantages"]
    loss = 0
    for s in (slice(0, 2), slice(2, 4)):
        loss = loss + (-adv[s] * w[s] * lp[s] * m[s]).sum() / m[s].sum() / 2
    loss.backward()
    diff = max(float((a - b.grad).abs().max()) for a, b in zip(perturbed, (model.emb, model.out)))
    scale = max(float(b.grad.abs().max()) for b in (model.emb, model.out))
    per_micro = [
        (w[s][mask[s].bool()].mean().item(), (torch.exp(delta[s]) > 2)[mask[s].bool()].float().mean().item())
        for s in (slice(0, 2), slice(2, 4))
    ]
    try:  # TIS on, no rollout log-probs in the batch: refused before any forward
        make_actor(model, recompute_old_log_prob=False, rollout_correction={"tis_cap": 2.0}).make_minibatch_iterator(
            make_batch()
        )
        missing = "no error"
    except KeyError as e:
        missing = str(e)
    return {
        "missing": missing,
        "identity": all(torch.equal(a, b) for a, b in zip(plain, same)),
        "identity_metrics": [(mm[WEIGHT_MEAN], mm[CAPPED_SHARE]) for mm in same_metrics],
        "metrics": [(mm[WEIGHT_MEAN], mm[CAPPED_SHARE]) for mm in metrics],
        "want_metrics": per_micro,
        "grad_diff": diff,
        "grad_scale": scale,
        "moved": max(float((a - b).abs().max()) for a, b in zip(plain, perturbed)),
    }


def scenario_update_policy_profiles_the_second_step(rank: int, world: int, out_dir: str) -> dict:
    import os

    from verl_patches import profiler

    init_megatron_tp1()
    os.environ["PROFILE_UPDATE"] = "1"
    traced: list = []

    class Recorder:
        def __init__(self, path, **kw):
            traced.append(path)

        def start(self):
            pass

        def step(self):
            pass

        def stop(self):
            pass

    profiler_cls = profiler.NPUProfiler

    class Fake(profiler_cls):
        def __init__(self, stage, **kw):
            super().__init__(stage, root=out_dir, factory=Recorder, **kw)

    profiler.NPUProfiler = Fake
    model = ToyModel()
    actor = make_actor(model, recompute_old_log_prob=False)
    batch = make_batch()
    batch.meta_info.update(temperature=1.0, micro_batch_size=2)
    iterations = []
    for _ in range(3):
        actor.update_policy(actor.make_minibatch_iterator(batch))
        iterations.append(actor.iteration)
    return {"iterations": iterations, "traced": traced}


def scenario_packed_refused(rank: int, world: int) -> str:
    from verl_patches.patches.verl.models.model_forward import PackedSequencesUnsupported

    init_megatron_tp1()
    try:
        make_actor(ToyModel(), use_packed_seq=True)
    except PackedSequencesUnsupported as e:
        return str(e)
    return "no error"


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_log_probs_and_entropy_use_the_sampling_temperature() -> None:
    (res,) = run_ranks(scenario_tempered_log_probs, 1, 120, preload=("verl_patches.prelude_patch",))
    for t in ("1.0", "0.7"):
        assert res[t][0] < 1e-6 and res[t][1] < 1e-6, res
    assert res["0.7-vs-T1"] > 1e-2  # a temperature that is silently ignored would pass the T=1 case only


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_recompute_old_log_prob_false_is_reinforce_with_ratio_one() -> None:
    (res,) = run_ranks(scenario_skip_old_log_prob, 1, 120, preload=("verl_patches.prelude_patch",))
    assert res["skipped"]
    assert "old_log_probs" not in res["keys"]
    assert res["clipfrac"] == 0.0 and res["ppo_kl"] == 0.0
    assert res["grad_diff"] < 1e-6, res
    assert "meta_info['temperature'] is missing" in res["missing"]


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tis_in_the_actors_update_is_an_identity_on_agreement_and_the_formula_on_a_perturbed_rollout() -> None:
    (res,) = run_ranks(scenario_tis_through_the_actor, 1, 120, preload=("verl_patches.prelude_patch",))
    assert res["identity"], res
    assert "tis_cap=2 needs the rollout's log-probs" in res["missing"]
    assert res["identity_metrics"] == [[1.0, 0.0], [1.0, 0.0]]
    for got, want in zip(res["metrics"], res["want_metrics"]):
        assert got == pytest.approx(want, rel=1e-6)
    assert any(capped > 0 for _, capped in res["want_metrics"])  # the cap is exercised
    assert res["moved"] > 1e-3 * res["grad_scale"]  # the weights changed the update
    assert res["grad_diff"] < 1e-6 * max(1.0, res["grad_scale"]), res


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_update_policy_counts_steps_and_profiles_the_second_one(tmp_path) -> None:
    (res,) = run_ranks(
        scenario_update_policy_profiles_the_second_step,
        1,
        120,
        preload=("verl_patches.prelude_patch",),
        kwargs={"out_dir": str(tmp_path)},
    )
    assert res["iterations"] == [1, 2, 3]
    assert res["traced"] == [str(tmp_path / "update_actor")]


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_packed_sequences_are_refused_with_the_key_to_change() -> None:
    (msg,) = run_ranks(scenario_packed_refused, 1, 120, preload=("verl_patches.prelude_patch",))
    assert "use_packed_seq" in msg and "set it to False" in msg
