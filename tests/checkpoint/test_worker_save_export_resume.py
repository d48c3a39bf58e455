"""verl's Megatron ``ActorRolloutRefWorker`` (MindSpeed-LLM DeepSeek-V3 on CPU, gloo) through our checkpoint
patches: save after a training step, export the saved actor to HF with our Megatron->HF tool, resume in a
fresh worker.

Two layouts, 2 ranks each, the distributed optimizer, fp32 (as the engine's golden test):

- EP2 (TP-extend-EP, DP2), after one ``update_actor``: the exported folder loads in transformers and gives
  the per-token log-probs the trained Megatron actor had, within 1e-4 (the engine's golden tolerance); a
  fresh worker (built from the converted initial weights, as a restarted job is) that loads the checkpoint
  has bit-identical log-probs, and one more ``update_actor`` on both leaves bit-identical parameters: the
  Adam moments and step count came back, not only the weights.
- PP2 with the uneven layer list [1, 2], without a training step (the engine's PP2 ``update_actor`` does
  not complete on CPU yet, and MindSpeed's all-to-all overlap cannot run a backward pass at EP1): save,
  export and resume give the same log-probs.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from golden_assets import RESPONSE, TEMPERATURE, build_hf_model, convert, hf_log_probs, make_batch, worker_config
from verl_patches.multirank import run_ranks

pytestmark = [pytest.mark.multiproc, pytest.mark.slow, pytest.mark.needs_components("mindspeed", "mindspeed_llm")]
EXPORT_TOL = 1e-4


def _barrier() -> None:
    torch.distributed.all_reduce(torch.zeros(1))  # the CPU npu emulation registers no accelerator for barrier()


def _dp_share(batch: dict, rank_dp: tuple[int, int]) -> dict:
    dp, r = rank_dp
    n = next(iter(batch.values())).shape[0] // dp
    return {k: v[r * n : (r + 1) * n] for k, v in batch.items()}


def _proto(batch: dict, **meta):
    from verl import DataProto

    return DataProto.from_dict(tensors=dict(batch), meta_info=dict(meta))


def rank_save_resume(
    rank: int, world: int, hf: str, ckpt: str, root: str, tp: int, pp: int, ep: int, layer_list, train: bool
) -> dict:
    from megatron.core import parallel_state as mpu
    from verl.utils.megatron_utils import unwrap_model
    from verl.workers.megatron_workers import ActorRolloutRefWorker

    from verl_patches.checkpoint import commit
    from verl_patches.patches.verl.workers.megatron_workers import trainer_config_view
    from verl_patches.train_engine.initialize import initialize_megatron
    from verl_patches.train_engine.translate import translate_verl_train_configs_to_megatron

    cfg = worker_config(Path(hf), Path(ckpt), tp, pp, ep, layer_list)
    args = initialize_megatron(translate_verl_train_configs_to_megatron(trainer_config_view(cfg.actor_rollout_ref)))
    args.bf16, args.params_dtype = False, torch.float32  # as the golden test: fp32 against HF fp32
    vocab = json.loads((Path(hf) / "config.json").read_text())["vocab_size"]
    full = make_batch(vocab)
    place = (mpu.get_data_parallel_world_size(), mpu.get_data_parallel_rank())
    mine = _dp_share(full, place)
    inputs = {k: v for k, v in mine.items() if k != "advantages"}
    # verl normalises the mini-batch per DP rank only for a role that is also a rollout; here "actor" alone
    cfg.actor_rollout_ref.actor.ppo_mini_batch_size = full["input_ids"].shape[0] // place[0]

    def trained_step(worker) -> None:
        worker.config.actor.recompute_old_log_prob = False
        worker.update_actor(_proto(mine, global_token_num=[int(mine["attention_mask"].sum())]))

    def log_probs(worker) -> torch.Tensor:
        worker.config.actor.recompute_old_log_prob = True
        return worker.compute_log_prob(_proto(inputs)).batch["old_log_probs"]

    def worker():  # each worker normalises its own copy of the config, as each Ray worker process does
        return ActorRolloutRefWorker(copy.deepcopy(cfg.actor_rollout_ref), "actor")

    actor = worker()
    actor.init_model()
    if train:
        trained_step(actor)
    lp = log_probs(actor)

    root_p = Path(root)
    staging = commit.begin_step(root_p, 1) if rank == 0 else root_p / commit.staging_dir_name(1)
    _barrier()
    actor.save_checkpoint(str(staging / "actor"), None, 1)
    _barrier()
    if rank == 0:
        commit.commit_step(root_p, staging, 1)
    _barrier()

    resumed = worker()
    resumed.init_model()  # the converted initial weights, as a restarted job builds them
    lp_initial = log_probs(resumed)
    resumed.load_checkpoint(str(root_p / "global_step_1" / "actor"), del_local_after_load=False)
    lp_resumed = log_probs(resumed)
    diff = None
    if train:
        trained_step(actor)
        trained_step(resumed)
        a = dict(unwrap_model(actor.actor_module[0]).named_parameters())
        b = dict(unwrap_model(resumed.actor_module[0]).named_parameters())
        diff = max(float((a[k] - b[k]).abs().max()) for k in a)
    torch.save({"lp": lp, "mask": mine["attention_mask"][:, -RESPONSE:]}, root_p / f"lp_rank{rank}.pt")
    return {
        "dp": place,
        "resumed_lp_diff": float((lp_resumed - lp).abs().max()),
        "initial_lp_diff": float((lp_initial - lp).abs().max()),
        "param_diff_after_next_step": diff,
        "optimizer": type(actor.actor_optimizer).__name__,
    }


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("ckpt_worker")
    hf = build_hf_model(root)
    return {
        "root": str(root),
        "hf": str(hf),
        "ep2": str(convert(hf, root / "ep2", tp=1, pp=1, ep=2, num_layer_list=None)),
        "pp2": str(convert(hf, root / "pp2", tp=1, pp=2, ep=1, num_layer_list=(1, 2))),
    }


# (name, tp, pp, ep, layer list, train, ranks that hold the DP shares of the log-probs, in DP order)
CASES = [("ep2", 1, 1, 2, None, True, [0, 1]), ("pp2", 1, 2, 1, [1, 2], False, [1])]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_save_export_and_resume(assets: dict[str, str], tmp_path: Path, case) -> None:
    from verl_patches.weights.mcore_to_hf import convert_mcore_to_hf

    name, tp, pp, ep, layer_list, train, lp_ranks = case
    ckroot = tmp_path / "checkpoints"
    results = run_ranks(
        rank_save_resume,
        2,
        900,
        preload=("verl_patches.prelude_patch",),
        kwargs=dict(
            hf=assets["hf"],
            ckpt=assets[name],
            root=str(ckroot),
            tp=tp,
            pp=pp,
            ep=ep,
            layer_list=layer_list,
            train=train,
        ),
    )
    print(json.dumps(results, indent=1))
    for r in results:
        assert r["optimizer"] in ("DistributedOptimizer", "ChainedOptimizer")
        assert r["resumed_lp_diff"] == 0.0, r
        if train:
            assert r["initial_lp_diff"] > 1e-4, r  # the trained step really changed the model
            assert r["param_diff_after_next_step"] == 0.0, r

    actor_dir = ckroot / "global_step_1" / "actor"
    saved_layout = json.loads((ckroot / "global_step_1" / "checkpoint.json").read_text())["roles"]["actor"]
    assert (saved_layout["tp"], saved_layout["pp"], saved_layout["ep"]) == (tp, pp, ep)
    assert saved_layout["num_layer_list"] == layer_list
    out = tmp_path / "hf_export"
    convert_mcore_to_hf(actor_dir, out, tokenizer_dir=actor_dir / "hf_config_and_tokenizer", progress=False)

    # the actor's log-probs: each DP rank returns its share of the batch (with PP, the last stage's are used)
    assert [tuple(results[r]["dp"])[1] for r in lp_ranks] == list(range(len(lp_ranks)))
    saved = [torch.load(ckroot / f"lp_rank{r}.pt") for r in lp_ranks]
    lp = torch.cat([s["lp"] for s in saved])
    mask = torch.cat([s["mask"] for s in saved]).bool()
    vocab = json.loads((out / "config.json").read_text())["vocab_size"]
    hf_lp, _ = hf_log_probs(out, make_batch(vocab), TEMPERATURE)
    diff = float((hf_lp - lp)[mask].abs().max())
    print("export log-prob diff", diff)
    assert diff < EXPORT_TOL
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(out) is not None
