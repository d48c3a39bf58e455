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

from verl_patches.multirank import run_ranks
from verl_patches.reshard.layout import RolloutLayout
from verl_patches.rollout import dp_env
from verl_patches.rollout.dp_env import DpEnvError, all_group_ports, dp_assignment

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
        with pytest.raises(DpEnvError, match=rf"rank 3: vLLM DP master port {port} on 127.0.0.1 is not free"):
            dp_env.check_port_free("127.0.0.1", port, 3)
    dp_env.check_port_free("127.0.0.1", port, 3)  # free again once released


def _exported_dp_env(rank: int, world: int) -> dict:
    env: dict[str, str] = {"HCCL_SOCKET_IFNAME": "lo"}
    base_port = int(os.environ["MASTER_PORT"]) + 10
    dp_env.init_vllm_dp_env(tp=2, dp=2, base_port=base_port, environ=env)
    return {"base_port": base_port, "env": {k: v for k, v in env.items() if k.startswith("VLLM_DP")}}


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_every_rank_exports_its_vllm_dp_env_over_gloo() -> None:
    got = run_ranks(_exported_dp_env, 8, 100)
    base = got[0]["base_port"]
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
