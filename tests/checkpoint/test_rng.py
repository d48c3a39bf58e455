"""The RNG states a checkpoint carries (`verl_patches.checkpoint.rng`): Python, NumPy, torch and the generators
components register (the CPU rollout stand-in's sampling stream), through a weights-only file as the actor
checkpoint writes them. A resume restores them, so the draws after it are the draws the saved run made next."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from verl_patches.checkpoint import rng


@pytest.fixture(autouse=True)
def clean_registry():
    before = rng.registered_generators()
    rng._GENERATORS.clear()
    yield
    rng._GENERATORS.clear()
    rng._GENERATORS.update(before)


def draws(generators: dict[str, torch.Generator]) -> list:
    return [
        random.random(),
        float(np.random.rand()),
        float(torch.rand(1)),
        *(float(torch.rand(1, generator=g)) for g in generators.values()),
    ]


def through_file(state: dict, tmp_path: Path) -> dict:
    path = tmp_path / "rank_00000.pt"
    torch.save(state, path)
    return torch.load(path, weights_only=True)


def test_restore_repeats_every_stream_including_registered_generators(tmp_path: Path) -> None:
    gens = {"a": torch.Generator().manual_seed(3), "b": torch.Generator().manual_seed(4)}
    for name, g in gens.items():
        rng.register_generator(name, g)
    draws(gens)  # advance past the seeds
    state = through_file(rng.capture(), tmp_path)
    assert sorted(state["generators"]) == ["a", "b"]
    expected = draws(gens)
    draws(gens)
    rng.restore(state, "rank_00000.pt")
    assert draws(gens) == expected


def test_a_new_owner_restores_into_its_own_generator(tmp_path: Path) -> None:
    """A resumed process builds a fresh engine (seeded again) and registers it under the same name."""
    old = torch.Generator().manual_seed(0)
    rng.register_generator("rollout", old)
    torch.rand(5, generator=old)
    state = through_file(rng.capture(), tmp_path)
    expected = torch.rand(3, generator=old)

    fresh = torch.Generator().manual_seed(0)
    rng.register_generator("rollout", fresh)
    assert rng.registered_generators() == {"rollout": fresh}
    rng.restore(state, "ckpt")
    assert torch.equal(torch.rand(3, generator=fresh), expected)


def test_a_registered_generator_missing_from_the_checkpoint_is_an_error_naming_the_file() -> None:
    state = rng.capture()  # nothing registered yet
    rng.register_generator("rollout_standin.sampling", torch.Generator())
    with pytest.raises(KeyError, match="ckpt/rng/rank_00003.pt: RNG state of generator 'rollout_standin.sampling'"):
        rng.restore(state, "ckpt/rng/rank_00003.pt")


def test_saved_generators_nobody_registered_are_ignored_and_unregister_checks_the_owner() -> None:
    g = torch.Generator()
    rng.register_generator("x", g)
    state = rng.capture()
    rng.unregister_generator("x", torch.Generator())  # someone else's: kept
    assert rng.registered_generators() == {"x": g}
    rng.unregister_generator("x", g)
    assert rng.registered_generators() == {}
    rng.restore(state, "ckpt")  # "x" in the file, not in this process: nothing to set
    with pytest.raises(TypeError, match="expected a torch.Generator"):
        rng.register_generator("y", 42)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    from verl_patches.weights.config import make_tiny_config

    cfg = make_tiny_config(vocab_size=48)
    cfg.update(eos_token_id=1, pad_token_id=0, bos_token_id=2)
    out = tmp_path_factory.mktemp("tiny-dsv3")
    torch.manual_seed(0)
    DeepseekV3ForCausalLM(DeepseekV3Config(**cfg)).save_pretrained(out, safe_serialization=True)
    return out


@pytest.mark.usefixtures("vllm_job_process")
def test_rollout_standin_sampling_resumes_where_the_saved_engine_left_off(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The stand-in samples from its own seeded generator; a checkpoint taken between two generate calls,
    restored into a freshly built engine (the resumed process), gives the second call's tokens again."""
    from vllm import SamplingParams

    from verl_patches.rollout.standin.engine import SAMPLING_GENERATOR, StandinLLM

    prompts = [{"prompt_token_ids": [2, 5, 7, 9]}, {"prompt_token_ids": [2, 11, 3]}]
    params = SamplingParams(n=4, temperature=1.0, max_tokens=6, logprobs=0)

    def tokens(engine: StandinLLM) -> list[list[int]]:
        return [list(c.token_ids) for out in engine.generate(prompts, params) for c in out.outputs]

    first = StandinLLM(model=str(tiny_model_dir), max_model_len=24, max_num_seqs=16, seed=7)
    assert rng.registered_generators()[SAMPLING_GENERATOR] is first._generator
    tokens(first)  # step 1's rollout
    state = through_file(rng.capture(), tmp_path)  # the checkpoint after step 1
    step2 = tokens(first)

    resumed = StandinLLM(model=str(tiny_model_dir), max_model_len=24, max_num_seqs=16, seed=7)
    rng.restore(state, "ckpt")
    assert tokens(resumed) == step2
    fresh = StandinLLM(model=str(tiny_model_dir), max_model_len=24, max_num_seqs=16, seed=7)
    assert tokens(fresh) != step2, "without the restore the draws start over (the bug this fixes)"
