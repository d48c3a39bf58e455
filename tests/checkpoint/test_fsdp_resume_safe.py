"""verl's FSDP checkpoint manager under our declared replacement of ``load_checkpoint`` (issue #27): the sharded
files verl writes (DTensors, NumPy's RNG state) load through the weights-only loader with their digests
checked, and a tampered file is refused by name, never unpickled. One process, gloo, world size 1."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from reseal import reseal_signed, reseal_unsigned
from verl_patches.base.free_port import free_port
from verl_patches.checkpoint import commit
from verl_patches.checkpoint.manifest import CheckpointIncomplete
from verl_patches.checkpoint.safe_load import UnsafeCheckpointError
from verl_patches.patches.verl.utils.checkpoint import fsdp_manager


@pytest.fixture(scope="module")
def fsdp_model():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    ours = not torch.distributed.is_initialized()
    if ours:
        torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1,))
    torch.manual_seed(0)
    model = FSDP(
        torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)),
        device_mesh=mesh,
        device_id=torch.device("cpu"),
        use_orig_params=True,
    )
    yield model
    if ours:
        torch.distributed.destroy_process_group()


def manager(model) -> SimpleNamespace:
    from verl.utils.checkpoint.checkpoint_manager import BaseCheckpointManager

    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return SimpleNamespace(
        model=model,
        optimizer=opt,
        lr_scheduler=sched,
        world_size=1,
        rank=0,
        load_rng_state=BaseCheckpointManager.load_rng_state,
        get_rng_state=BaseCheckpointManager.get_rng_state,
    )


def save_like_verl(m: SimpleNamespace, role: Path) -> None:
    """The three files FSDPCheckpointManager.save_checkpoint writes, as it writes them."""
    from torch.distributed.fsdp import ShardedOptimStateDictConfig, ShardedStateDictConfig, StateDictType
    from verl.utils.fsdp_utils import get_fsdp_state_ctx

    role.mkdir(parents=True)
    with get_fsdp_state_ctx(
        m.model, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig(), ShardedOptimStateDictConfig()
    ):
        torch.save(m.model.state_dict(), role / "model_world_size_1_rank_0.pt")
        torch.save(m.optimizer.state_dict(), role / "optim_world_size_1_rank_0.pt")
        torch.save(
            {"lr_scheduler": m.lr_scheduler.state_dict(), "rng": m.get_rng_state()},
            role / "extra_state_world_size_1_rank_0.pt",
        )


def test_fsdp_checkpoint_round_trips_through_the_safe_loader(tmp_path: Path, fsdp_model) -> None:
    m = manager(fsdp_model)
    m.model(torch.ones(3, 4)).sum().backward()
    m.optimizer.step()
    m.lr_scheduler.step()
    staging = commit.begin_step(tmp_path, 1)
    save_like_verl(m, staging / "actor")
    step = commit.commit_step(tmp_path, staging, 1)
    want = {k: v.detach().clone() for k, v in m.model.named_parameters()}
    with torch.no_grad():
        for p in m.model.parameters():
            p.zero_()
    fresh = manager(fsdp_model)
    fsdp_manager.load_checkpoint(fresh, str(step / "actor"))
    got = dict(fresh.model.named_parameters())
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert fresh.optimizer.state_dict()["state"] and fresh.lr_scheduler.last_epoch == 1


def test_tampered_fsdp_file_is_refused_unread(tmp_path: Path, fsdp_model) -> None:
    from test_safe_load import tampered_bytes

    m = manager(fsdp_model)
    staging = commit.begin_step(tmp_path, 1)
    save_like_verl(m, staging / "actor")
    step = commit.commit_step(tmp_path, staging, 1)
    target = step / "actor" / "extra_state_world_size_1_rank_0.pt"
    marker = tmp_path / "ran"
    target.write_bytes(tampered_bytes(marker, target.stat().st_size))
    with pytest.raises(UnsafeCheckpointError, match=f"^{target}: sha256"):
        fsdp_manager.load_checkpoint(manager(fsdp_model), str(step / "actor"))
    reseal_unsigned(step, "actor/extra_state_world_size_1_rank_0.pt")  # a forger without the run's secret
    with pytest.raises(CheckpointIncomplete, match="checkpoint.json: its signature does not match the run secret"):
        fsdp_manager.load_checkpoint(manager(fsdp_model), str(step / "actor"))
    reseal_signed(step, "actor/extra_state_world_size_1_rank_0.pt")  # one with it: the loader still refuses
    with pytest.raises(UnsafeCheckpointError, match=f"^{target}: not a torch file in the zip format"):
        fsdp_manager.load_checkpoint(manager(fsdp_model), str(step / "actor"))
    assert not marker.exists()
