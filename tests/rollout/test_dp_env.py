"""F2: vLLM DP groups per rank. Group membership equals what vLLM's own initialize_model_parallel
builds; every DP group of a 256-rank, 16-node job gets a distinct free port; the host address comes
from the kernel without probing the internet; ports are checked by binding; VLLM_DP_* are exported
per rank over a real gloo process group."""

from __future__ import annotations

import os
import socket
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_patches.base.free_port import free_port_block
from verl_patches.multirank import run_ranks
from verl_patches.reshard.layout import RolloutLayout
from verl_patches.rollout import dp_env
from verl_patches.rollout.dp_env import DpEnvError, all_group_ports, dp_assignment
from verl_patches.worker_calls.env_names import DP_BASE_PORT_ENV

A3_LAYOUTS = [RolloutLayout(256, 2, 64), RolloutLayout(256, 2, 128)]  # true weight (2 instances), random init


def vllm_dp_groups(world: int, tp: int, dp: int, monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The DP groups vLLM 0.9.1's own initialize_model_parallel builds, recorded without communication."""
    import torch.distributed as tdist
    from vllm.distributed import parallel_state as ps

    recorded: dict[str, list[list[int]]] = {}
    monkeypatch.setattr(tdist, "is_initialized", lambda: True)
    monkeypatch.setattr(tdist, "get_world_size", lambda *a: world)
    monkeypatch.setattr(tdist, "get_rank", lambda *a: 0)
    monkeypatch.setattr(ps, "get_world_group", lambda: SimpleNamespace(local_rank=0, device_group=None))
    monkeypatch.setattr(
        "vllm.config.get_current_vllm_config",
        lambda: SimpleNamespace(parallel_config=SimpleNamespace(data_parallel_size=dp)),
    )
    monkeypatch.setattr(
        ps,
        "init_model_parallel_group",
        lambda groups, local_rank, backend, group_name, **kw: (
            recorded.setdefault(group_name, groups) and SimpleNamespace(rank_in_group=0)
        ),
    )
    for name in ("_TP", "_PP", "_DP", "_EP"):
        monkeypatch.setattr(ps, name, None)
    ps.initialize_model_parallel(tp, 1, backend="gloo")
    return recorded["dp"]


@pytest.mark.parametrize(
    "layout",
    A3_LAYOUTS + [RolloutLayout(16, 2, 4), RolloutLayout(8, 1, 4)],
    ids=lambda layout: f"w{layout.world_size}-tp{layout.tp}-dp{layout.dp_per_instance}",
)
def test_groups_are_vllms_own(layout: RolloutLayout, monkeypatch: pytest.MonkeyPatch) -> None:
    groups = vllm_dp_groups(layout.world_size, layout.tp, layout.dp_per_instance, monkeypatch)
    for group in groups:
        for dp_rank, rank in enumerate(group):
            a = dp_assignment(rank, layout, 29444)
            assert (a.dp_rank, a.master_rank, a.dp_size) == (dp_rank, group[0], layout.dp_per_instance)
    assert len({dp_assignment(g[0], layout, 29444).port for g in groups}) == len(groups)


@pytest.mark.parametrize("layout", A3_LAYOUTS, ids=["dp64x2", "dp128"])
def test_256_ranks_on_16_nodes_get_distinct_ports_per_group(layout: RolloutLayout) -> None:
    base = 29444
    ports = all_group_ports(layout, base)
    assert len(ports) == layout.num_instances * layout.tp == len(set(ports.values()))
    assert set(ports.values()) == set(range(base + 1, base + 1 + len(ports)))  # the preflight's port plan
    nodes = {node: [dp_assignment(r, layout, base) for r in range(node * 16, node * 16 + 16)] for node in range(16)}
    for members in nodes.values():  # every rank of a node agrees with its group's master on the port
        for a in members:
            assert a.port == ports[a.master_rank]
    # The vendor's index r0 // dp_world + r0 % dp_world gives two instances colliding ports.
    if layout.num_instances > 1:
        dp_world = layout.instance_size
        vendor = [m // dp_world + m % dp_world for m in ports]
        assert len(set(vendor)) < len(vendor)


@settings(max_examples=200, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), dp=st.integers(1, 32), instances=st.integers(1, 8))
def test_ports_distinct_and_groups_consistent_for_any_layout(tp: int, dp: int, instances: int) -> None:
    layout = RolloutLayout(tp * dp * instances, tp, dp)
    ports = all_group_ports(layout, 20000)
    assert len(set(ports.values())) == instances * tp
    for rank in range(layout.world_size):
        a = dp_assignment(rank, layout, 20000)
        assert dp_assignment(a.master_rank, layout, 20000).dp_rank == 0
        assert a.master_rank + a.dp_rank * tp == rank


def test_port_out_of_range_names_rank_and_port() -> None:
    with pytest.raises(DpEnvError, match=r"rank 255: DP master port 65537"):
        dp_assignment(255, RolloutLayout(256, 2, 64), 65535 - 2)


def test_host_address_uses_the_named_interface_without_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_connect(*a, **k):
        raise AssertionError("probed the network")

    monkeypatch.setattr(socket.socket, "connect", no_connect)
    assert dp_env.host_address({"HCCL_SOCKET_IFNAME": "lo"}) == "127.0.0.1"
    with pytest.raises(DpEnvError, match="HCCL_SOCKET_IFNAME.*no-such-nic"):
        dp_env.host_address({"HCCL_SOCKET_IFNAME": "no-such-nic"})
    assert dp_env.host_address({})  # host name fallback, no packet sent


def test_busy_port_is_one_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(
            DpEnvError,
            match=rf"rank 3: vLLM DP master port {port} on 127.0.0.1 is in use; .*VERL_PATCHES_VLLM_DP_BASE_PORT",
        ):
            dp_env.check_port_free("127.0.0.1", port, 3)
    dp_env.check_port_free("127.0.0.1", port, 3)  # free again once released


def _exported_dp_env(rank: int, world: int, environ: dict[str, str]) -> dict:
    env = dict(environ)
    base_port = dp_env.dp_base_port(env)
    dp_env.init_vllm_dp_env(tp=2, dp=2, base_port=base_port, environ=env)
    return {"base_port": base_port, "env": {k: v for k, v in env.items() if k.startswith("VLLM_DP")}}


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_every_rank_exports_its_vllm_dp_env_over_gloo() -> None:
    base = free_port_block(4) - 1  # as the launch hands it out: 2 instances x TP2 = 4 DP master ports
    environ = {"HCCL_SOCKET_IFNAME": "lo", DP_BASE_PORT_ENV: str(base)}
    got = run_ranks(_exported_dp_env, 8, 100, kwargs={"environ": environ})
    for rank, out in enumerate(got):  # 2 instances of DP2 x TP2
        instance, local = divmod(rank, 4)
        assert out == {
            "base_port": base,
            "env": {
                "VLLM_DP_SIZE": "2",
                "VLLM_DP_RANK": str(local // 2),
                "VLLM_DP_RANK_LOCAL": str(local // 2),
                "VLLM_DP_MASTER_IP": "127.0.0.1",
                "VLLM_DP_MASTER_PORT": str(base + 1 + instance * 2 + local % 2),
            },
        }


def test_export_env_sets_exactly_the_five_variables() -> None:
    env: dict[str, str] = {"OTHER": "x"}
    a = dp_assignment(5, RolloutLayout(8, 2, 2), 30000)
    dp_env.export_env(a, "10.0.0.2", env)
    assert env == {
        "OTHER": "x",
        "VLLM_DP_SIZE": "2",
        "VLLM_DP_RANK": "0",
        "VLLM_DP_RANK_LOCAL": "0",
        "VLLM_DP_MASTER_IP": "10.0.0.2",
        "VLLM_DP_MASTER_PORT": str(30000 + 1 + 1 * 2 + 1),
    }
    assert os.environ.get("VLLM_DP_MASTER_IP") != "10.0.0.2"


def test_the_base_port_is_the_launchs_variable_and_a_bad_one_is_named() -> None:
    assert dp_env.dp_base_port({DP_BASE_PORT_ENV: " 29444 ", "MASTER_PORT": "59015"}) == 29444
    with pytest.raises(
        DpEnvError, match=r"VERL_PATCHES_VLLM_DP_BASE_PORT is not set.*MASTER_PORT inside a verl worker"
    ):
        dp_env.dp_base_port({"MASTER_PORT": "59015"})  # verl's torch.distributed port is never taken as the base
    for bad in ("29444x", "-1", "65535", "1e4", "0x7000"):
        with pytest.raises(DpEnvError, match="VERL_PATCHES_VLLM_DP_BASE_PORT"):
            dp_env.dp_base_port({DP_BASE_PORT_ENV: bad})


@settings(max_examples=100, deadline=None)
@given(
    tp=st.sampled_from([1, 2, 4, 8]),
    dp=st.integers(1, 32),
    instances=st.integers(1, 8),
    per_node=st.sampled_from([1, 8, 16]),
)
def test_the_preflights_port_count_is_the_number_of_ports_the_job_uses(
    tp: int, dp: int, instances: int, per_node: int
) -> None:
    from omegaconf import OmegaConf

    from verl_patches.launch.preflight.host import vllm_dp_port_count

    world = tp * dp * instances
    if world % per_node:
        per_node = 1
    cfg = OmegaConf.create(
        {
            "trainer": {"nnodes": world // per_node, "n_gpus_per_node": per_node},
            "actor_rollout_ref": {"rollout": {"name": "vllm", "tensor_model_parallel_size": tp}},
            "overlay": {"vllm_dp_size": dp},
        }
    )
    # VLLM_DP_SIZE 1 forms no DP group (verl_hooks inits none): no port
    used = len(all_group_ports(RolloutLayout(world, tp, dp), 20000)) if dp > 1 else 0
    assert vllm_dp_port_count(cfg) == used


def test_rollout_init_takes_the_dp_ports_from_the_launch_not_from_verls_master_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """verl's rank 0 replaces MASTER_PORT with torch.distributed's port (from the kernel's ephemeral range):
    the ports after it are anyone's. The rollout's DP ports come from the launch's variable."""
    from verl_patches.rollout import verl_hooks

    calls: list[dict] = []
    monkeypatch.setattr(verl_hooks, "init_vllm_dp_env", lambda **kw: calls.append(kw))
    monkeypatch.setenv("MASTER_PORT", "59015")
    monkeypatch.setenv("VLLM_DP_SIZE", "2")
    monkeypatch.delenv("VLLM_DP_MASTER_PORT", raising=False)
    monkeypatch.setenv(DP_BASE_PORT_ENV, "29444")
    verl_hooks._dp_env_from_config({"tensor_model_parallel_size": 2})
    assert calls == [{"tp": 2, "dp": 2, "base_port": 29444}]
    monkeypatch.delenv(DP_BASE_PORT_ENV)
    with pytest.raises(DpEnvError, match=DP_BASE_PORT_ENV):
        verl_hooks._dp_env_from_config({"tensor_model_parallel_size": 2})
    monkeypatch.setenv("VLLM_DP_MASTER_PORT", "30001")  # set by hand: nothing to derive
    verl_hooks._dp_env_from_config({"tensor_model_parallel_size": 2})
    monkeypatch.setenv("VLLM_DP_SIZE", "1")
    monkeypatch.delenv("VLLM_DP_MASTER_PORT")
    verl_hooks._dp_env_from_config({"tensor_model_parallel_size": 2})
    assert len(calls) == 1
