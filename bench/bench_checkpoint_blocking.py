"""Checkpoint blocking time: the same save in the foreground and written in the background, side by side.

Two CPU processes (gloo) hold MindSpeed-LLM's DeepSeek-V3-shaped model of tests/checkpoint's job (MLA, a dense
and MoE layers, TP-extend-EP at EP2, the distributed optimizer chained over the dense DP group of 2 ranks and the
experts' group of one), widened by ``--hidden``/``--experts`` so that a save writes tens to hundreds of MB. After
one training step (Adam holds moments), each rank saves the same state through the real save path
(`actor_state.snapshot_actor` / `write_actor`, the trainer's with ``overlay.async_checkpoint``), ``--repeats``
times each way:

  * foreground: the save call returns when its files are written: the step stands still for all of it;
  * background: the save call takes the snapshot and returns (`background_write`); the next step's work before
    its update runs (``--work-s`` seconds, a sleep: on A3 that work is the devices', the host is free to write);
    then the fence waits for what the write has not finished. The step stands still for the snapshot and the
    fence's wait.

Per rank and mode: MB written, the write's own seconds, the seconds the step stood still (medians). The
background's files must hold the same tensors as the foreground's (checked). PASS when, on every rank, the
background blocks less than the foreground; exit status 1 on FAIL.

    .venv/bin/python bench/bench_checkpoint_blocking.py [--hidden 256] [--experts 16] [--work-s 2] [--repeats 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "train_engine"))  # the tiny DeepSeek-V3 config of the engine tests


def hf_config(hidden: int, experts: int) -> dict:
    from tiny_dsv3 import TINY_HF_CONFIG

    return {
        **TINY_HF_CONFIG,
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "moe_intermediate_size": hidden,
        "n_routed_experts": experts,
        "vocab_size": 4 * hidden,
    }


def _build(cfg: dict):
    import torch
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.training.training import get_model

    from tiny_dsv3 import verl_config
    from verl_patches.train_engine.initialize import initialize_megatron
    from verl_patches.train_engine.model import gpt_model_provider
    from verl_patches.train_engine.translate import translate_verl_train_configs_to_megatron

    initialize_megatron(translate_verl_train_configs_to_megatron(verl_config(expert_model_parallel_size=2), cfg))
    model = get_model(gpt_model_provider, wrap_with_ddp=True)  # the job's provider
    opt = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=1e-3, use_distributed_optimizer=True, params_dtype=torch.float32), model
    )
    return model, opt


def _train_step(model, opt) -> None:
    ddp = model[0]
    ddp.zero_grad_buffer()
    opt.zero_grad()
    loss = sum((p * p).sum() for p in ddp.module.parameters())
    loss.backward()
    ddp.finish_grad_sync()
    opt.step()


def _barrier() -> None:
    import torch

    torch.distributed.all_reduce(torch.zeros(1))  # the CPU npu emulation registers no accelerator for barrier()


def _tensors(obj, out: list, where: str = "") -> list:
    import torch

    if isinstance(obj, torch.Tensor):
        out.append((where, obj))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _tensors(v, out, f"{where}/{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _tensors(v, out, f"{where}[{i}]")
    return out


def _same_files(a: Path, b: Path) -> bool:
    import torch

    for rel in sorted(p.relative_to(a) for p in a.rglob("*.pt")):
        x = _tensors(torch.load(a / rel, weights_only=True), [])
        y = _tensors(torch.load(b / rel, weights_only=True), [])
        if [w for w, _ in x] != [w for w, _ in y] or not all(torch.equal(s, t) for (_, s), (_, t) in zip(x, y)):
            return False
    return True


def measure_rank(rank: int, world: int, out_dir: str, hidden: int, experts: int, work_s: float, repeats: int):
    import torch

    from verl_patches.checkpoint import background_write
    from verl_patches.train_engine import actor_state

    torch.manual_seed(0)
    model, opt = _build(hf_config(hidden, experts))
    _train_step(model, opt)
    rows: dict[str, list[dict]] = {"foreground": [], "background": []}
    same = True
    for r in range(repeats):
        fg = Path(out_dir) / f"fg{r}" / "actor"
        _barrier()
        t0 = time.monotonic()
        record = actor_state.save_actor(fg, 1, model, opt, None, True)
        blocked = time.monotonic() - t0
        rows["foreground"].append({"bytes": sum(record.files.values()), "write_s": blocked, "blocked_s": blocked})

        bg = Path(out_dir) / f"bg{r}" / "actor"
        _barrier()
        t0 = time.monotonic()
        snap = actor_state.snapshot_actor(bg, 1, model, opt, None, True)
        background_write.start(
            background_write.BackgroundWrite(1, rank, lambda report, snap=snap: actor_state.write_actor(snap, report))
        )
        snapshot_s = time.monotonic() - t0
        time.sleep(work_s)  # the next step's rollout and reference: the devices' work
        fenced = background_write.fence_pending()
        rows["background"].append(
            {
                "bytes": sum(fenced.result.files.values()),
                "write_s": fenced.write_s,
                "blocked_s": snapshot_s + fenced.waited_s,
                "snapshot_s": snapshot_s,
                "fence_s": fenced.waited_s,
            }
        )
        same &= _same_files(fg, bg)
    return {"rank": rank, "rows": rows, "same": same}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--work-s", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    from verl_patches.multirank import run_ranks  # as this script's other imports of ours: in the function

    with tempfile.TemporaryDirectory() as tmp:
        results = run_ranks(
            measure_rank,
            2,
            1500,
            preload=("verl_patches.prelude_patch",),
            kwargs=dict(out_dir=tmp, hidden=a.hidden, experts=a.experts, work_s=a.work_s, repeats=a.repeats),
        )
    print(
        f"\n== checkpoint blocking: 2 ranks (EP2, DP2 dense / 1 expert), hidden {a.hidden}, {a.experts} experts, "
        f"next step's work {a.work_s:.1f} s, median of {a.repeats} =="
    )
    print(f"{'rank':>4} {'mode':<11} {'MB':>8} {'write s':>8} {'blocked s':>10} {'snapshot s':>11} {'fence s':>8}")
    ok = True
    for res in results:
        med = {
            mode: {k: statistics.median(row[k] for row in rows) for k in rows[0]} for mode, rows in res["rows"].items()
        }
        for mode, m in med.items():
            extra = f"{m['snapshot_s']:>11.2f} {m['fence_s']:>8.2f}" if mode == "background" else f"{'':>11} {'':>8}"
            print(
                f"{res['rank']:>4} {mode:<11} {m['bytes'] / 1e6:>8.1f} {m['write_s']:>8.2f} {m['blocked_s']:>10.2f} "
                f"{extra}"
            )
        ratio = med["background"]["blocked_s"] / med["foreground"]["blocked_s"]
        print(f"{res['rank']:>4} {'ratio':<11} background blocks {ratio:.2f} x the foreground")
        ok &= ratio < 1.0 and res["same"]
        if not res["same"]:
            print(f"rank {res['rank']}: the background save's files differ from the foreground's")
    print(
        f"\n{'PASS' if ok else 'FAIL'}: on every rank the background save blocks the step less than the foreground "
        "save and writes the same tensors"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
