"""One rank of a small Megatron training job that checkpoints and resumes (run by test_kill_resume.py).

Usage (environment: RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT):
    python tests/checkpoint/actor_job.py --root DIR --steps 6 --save-freq 2 --keep 2 --tp 1 --ep 2

The test injects failures through CKPT_TEST_KILL="RANK:STEP:PHASE" so every launch is the same command:
``save``: that rank dies (SIGKILL) while saving STEP, after its model shard and before its record;
``write``: with ``--background``, that rank's background write of STEP kills its process after the first file
(the main thread is then in the next step's work or at its fence);
``step``: that rank dies before computing STEP; ``job``: after STEP's metrics, RANK writes ``.kill_job`` and
every rank waits for the harness to SIGKILL the whole job. A checkpoint that cannot be resumed at this
layout ends the process with exit status 3 and the error on stderr.

``--background`` saves as the trainer does with ``overlay.async_checkpoint`` (issue 42): the save takes the
snapshot (`actor_state.snapshot_actor`) and a `background_write.BackgroundWrite` writes the files while the
job goes on to the next step's work before its update (``--work-s`` seconds: the rollout and reference stand-in);
the fence before the update waits for every rank's write, then rank 0 commits the step. ``--slow-write-s``
makes every file of the write take that much longer, and every rank appends its events (write done, work done,
fence passed, update started; monotonic times) to ``events.jsonl``, so a test can read their order.

The model is MindSpeed-LLM's DeepSeek-V3 GPTModel (tests/train_engine/tiny_dsv3.py) built through our
D1 bring-up, wrapped in Megatron's DDP, with Megatron's distributed optimizer (chained: dense and expert
parameter groups over their own DP groups). A step draws noise from torch's and Megatron's tracker RNGs,
back-propagates a loss built from them and the batch (the DDP hooks fill and reduce-scatter the gradient
buffers) and takes an Adam step; so the metrics after a
resume equal an uninterrupted run's only if the model, the optimizer (moments and step count), the RNG
states and the data position all came back. Rank 0 appends each step's metrics to ``metrics.jsonl``.
(The forward pass is not used: the MindSpeed builder ops' CPU emulation is outside this test's scope.)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE.parent / "train_engine")]

import torch  # noqa: E402

from verl_patches.base.rank_exit import exit_rank  # noqa: E402


def build(tp: int, ep: int, pp: int, layer_list: list[int] | None):
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.training.training import get_model

    from tiny_dsv3 import TINY_HF_CONFIG, verl_config
    from verl_patches.train_engine.initialize import initialize_megatron
    from verl_patches.train_engine.model import gpt_model_provider
    from verl_patches.train_engine.translate import translate_verl_train_configs_to_megatron

    megatron = dict(tensor_model_parallel_size=tp, expert_model_parallel_size=ep, pipeline_model_parallel_size=pp)
    if layer_list:
        megatron["pipeline_parallel_num_layer_list"] = layer_list
    initialize_megatron(translate_verl_train_configs_to_megatron(verl_config(**megatron), TINY_HF_CONFIG))
    model = get_model(gpt_model_provider, wrap_with_ddp=True)  # the job's provider
    opt = get_megatron_optimizer(
        OptimizerConfig(
            optimizer="adam",
            lr=1e-2,
            weight_decay=0.01,
            clip_grad=1.0,
            use_distributed_optimizer=True,
            params_dtype=torch.float32,
            adam_beta1=0.9,
            adam_beta2=0.95,
        ),
        model,
    )
    from verl_patches.weights.config import make_tiny_config

    return model, opt, make_tiny_config(**TINY_HF_CONFIG)  # the full config.json the export tool checks


def train_step(model, opt, data_position: int) -> dict:
    """One synthetic step; the batch is the data position's seed, the noise comes from the live RNGs."""
    from megatron.core import tensor_parallel

    ddp = model[0]
    ddp.zero_grad_buffer()
    opt.zero_grad()
    batch = torch.Generator().manual_seed(1000 + data_position)
    noise = torch.randn(1).item()  # torch's global RNG
    with tensor_parallel.get_cuda_rng_tracker().fork():  # Megatron's model-parallel RNG stream
        tracked = torch.rand(1).item()
    loss = 0.0
    for _name, p in sorted(ddp.module.named_parameters()):
        target = torch.randn(p.shape, generator=batch) + 0.01 * noise + 0.01 * tracked
        loss = loss + (p * target).sum() + 0.05 * p.pow(2).sum()
    loss.backward()  # DDP's hooks accumulate into its buffers and start the reduce-scatter
    ddp.finish_grad_sync()
    ok, grad_norm, _ = opt.step()
    sq = torch.tensor(
        [sum(float(p.detach().double().pow(2).sum()) for p in ddp.module.parameters())], dtype=torch.float64
    )
    torch.distributed.all_reduce(sq)
    stats = torch.tensor([noise, tracked], dtype=torch.float64)
    torch.distributed.all_reduce(stats)
    return {
        "param_sq": float(sq),
        "grad_norm": float(grad_norm),
        "rng": stats.tolist(),
        "adam_step": opt.param_groups[0].get("step"),
        "data_position": data_position,
    }


def barrier() -> None:
    # torch.distributed.barrier() asks for the accelerator, which the CPU npu emulation does not register
    torch.distributed.all_reduce(torch.zeros(1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--save-freq", type=int, default=2)
    ap.add_argument("--keep", type=int, default=2)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--ep", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--layer-list", default="")
    ap.add_argument("--background", action="store_true")
    ap.add_argument("--work-s", type=float, default=0.0)
    ap.add_argument("--slow-write-s", type=float, default=0.0)
    a = ap.parse_args()
    kill = os.environ.get("CKPT_TEST_KILL", "")
    a.kill_rank, a.kill_at, a.kill_phase = (
        (int(kill.split(":")[0]), int(kill.split(":")[1]), kill.split(":")[2]) if kill else (-1, -1, "")
    )
    torch.set_num_threads(1)

    import verl_patches.prelude_patch  # noqa: F401  (as in every worker process)
    from verl_patches.checkpoint import background_write, commit
    from verl_patches.checkpoint.manifest import LayoutChangeError, rank_record_name
    from verl_patches.checkpoint.plan import is_save_step
    from verl_patches.train_engine import actor_state

    rank = int(os.environ["RANK"])
    torch.distributed.init_process_group("gloo", rank=rank, world_size=int(os.environ["WORLD_SIZE"]))
    model, opt, hf_config = build(a.tp, a.ep, a.pp, [int(x) for x in a.layer_list.split(",")] if a.layer_list else None)
    root = Path(a.root)
    root.mkdir(parents=True, exist_ok=True)
    log = root / "metrics.jsonl"
    events = root / "events.jsonl"

    def event(what: str, step: int) -> None:
        with open(events, "a") as f:
            f.write(json.dumps({"rank": rank, "what": what, "step": step, "t": time.monotonic()}) + "\n")

    pending: list[int] = []  # the step whose files are being written in the background

    def fence_and_commit() -> None:
        """The fence before an update: every rank's write done, then rank 0 commits (the driver's part)."""
        if not pending:
            return
        background_write.fence_pending()
        event("fence passed", pending[0])
        barrier()
        if rank == 0:
            step_dir = commit.staging_dir_name(pending[0])
            commit.commit_step(root, root / step_dir, pending[0])
            commit.prune(root, a.keep, protect=(commit.step_dir_name(pending[0]),))
        barrier()
        pending.clear()

    def background_save(staging: Path, step: int) -> None:
        snap = actor_state.snapshot_actor(staging / "actor", step, model, opt, hf_config, True)
        die = rank == a.kill_rank and step == a.kill_at and a.kill_phase == "write"

        def write(report):
            def slow_report(path, complete):
                if complete:
                    time.sleep(a.slow_write_s)
                    if die:  # a crash in the middle of the background write: one file on disk, no record
                        os.kill(os.getpid(), signal.SIGKILL)
                report(path, complete)

            record = actor_state.write_actor(snap, slow_report)
            event("write done", step)
            return record

        background_write.start(background_write.BackgroundWrite(step, rank, write))
        pending.append(step)

    start, data_position = 0, 0
    point = commit.find_resume(root)
    if point is not None:
        step_dir = root / point.name
        try:
            note = actor_state.load_actor(step_dir / "actor", model, opt, use_distributed_optimizer=True)
        except LayoutChangeError as err:
            print(f"LayoutChangeError: {err}", file=sys.stderr, flush=True)
            exit_rank(3)
        data_position = json.loads((step_dir / "trainer_state.json").read_text())["data_position"]
        start = point.step
        if rank == 0:
            print(
                f"verl_patches resume: from {step_dir} (step {point.step}){'; ' + note if note else ''}"
                f"{'; ' + point.note if point.note else ''}",
                flush=True,
            )
    for step in range(start + 1, a.steps + 1):
        if rank == a.kill_rank and step == a.kill_at and a.kill_phase == "step":
            os.kill(os.getpid(), signal.SIGKILL)
        if pending:
            time.sleep(a.work_s)  # the next step's rollout and reference: they read the weights, change nothing
            event("work done", pending[0])
        fence_and_commit()
        event("update started", step)
        metrics = train_step(model, opt, data_position)
        data_position += 1
        if rank == 0:
            with open(log, "a") as f:
                f.write(json.dumps({"step": step, "launch": os.environ.get("CKPT_TEST_LAUNCH", ""), **metrics}) + "\n")
        if step == a.kill_at and a.kill_phase == "job":
            if rank == a.kill_rank:
                (root / ".kill_job").write_text(str(step))
            while True:  # the harness kills every process of the job
                time.sleep(1)
        if is_save_step(step, a.save_freq, step == a.steps):
            staging = root / commit.staging_dir_name(step) if rank else commit.begin_step(root, step)
            barrier()
            if rank == a.kill_rank and step == a.kill_at and a.kill_phase == "save":
                # a crash while saving: this rank's model shard is written, its record never is
                actor_state.save_actor(staging / "actor", step, model, opt, hf_config, True)
                (staging / "actor" / rank_record_name(rank)).unlink()
                os.kill(os.getpid(), signal.SIGKILL)
            if a.background:
                background_save(staging, step)
                if rank == 0:  # the driver's part, written with the save: the position this step left
                    from verl_patches.base.atomic_write import write_json_atomically

                    write_json_atomically(staging / "trainer_state.json", {"data_position": data_position})
                continue
            actor_state.save_actor(staging / "actor", step, model, opt, hf_config, True)
            barrier()
            if rank == 0:
                from verl_patches.base.atomic_write import write_json_atomically

                write_json_atomically(staging / "trainer_state.json", {"data_position": data_position})
                commit.commit_step(root, staging, step)
                commit.prune(root, a.keep, protect=(commit.step_dir_name(step),))
            barrier()
    fence_and_commit()  # the run ends with its last save committed
    barrier()
    if rank == 0:
        print("done", flush=True)
    exit_rank(0)


if __name__ == "__main__":
    main()
