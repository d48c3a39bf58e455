"""torch_npu's HCCL monitor and flight recorder: the launcher sets them, the driver's hang report signals the
dump through the job's store and says where the dumps are; the audit lists what is watched; the launcher
repeats the report as its last line."""

from __future__ import annotations

import json
import struct
from datetime import timedelta
from pathlib import Path

import pytest

from verl_patches.launch.job_env import as_dict, hccl_flight_recorder, job_environment
from verl_patches.launch.settings import load_settings
from verl_patches.resilience import worker_deadline
from verl_patches.resilience.boards import DictBoard
from verl_patches.resilience.call_watch import CallWatch
from verl_patches.resilience.heartbeat import Heartbeat, process_identity
from verl_patches.resilience.timeout import TIMEOUT_ENV
from verl_patches.resilience.watched import watched

CLUSTER = {"MASTER_ADDR": "10.0.0.1", "SOCKET_IFNAME": "enp189s0f0", "JEMALLOC_LIB": "none"}
NPU_VARS = (
    "TORCH_HCCL_ENABLE_MONITORING",
    "TORCH_HCCL_DUMP_ON_TIMEOUT",
    "TORCH_HCCL_TRACE_BUFFER_SIZE",
    "TORCH_HCCL_HEARTBEAT_TIMEOUT_SEC",
    "TORCH_HCCL_DEBUG_INFO_TEMP_FILE",
)


def test_the_job_turns_the_flight_recorder_on_below_hccls_time_out(tmp_path: Path) -> None:
    d = as_dict(job_environment(load_settings(CLUSTER, None, environ={}), 64))
    assert [d[k] for k in NPU_VARS] == ["1", "1", "2000", "540", "/tmp/hccl_trace_rank_"]
    assert int(d["TORCH_HCCL_HEARTBEAT_TIMEOUT_SEC"]) < int(d["HCCL_EXEC_TIMEOUT"]) and d[TIMEOUT_ENV] == "540"
    env = tmp_path / "cluster.env"
    env.write_text("HCCL_EXEC_TIMEOUT=1200\n")
    variables = job_environment(load_settings(CLUSTER, env, environ={}), 64)
    assert as_dict(variables)["TORCH_HCCL_HEARTBEAT_TIMEOUT_SEC"] == "1080"
    assert all([v.name for v in variables].count(k) == 1 for k in NPU_VARS)
    # a value the user's settings carry wins (the env file accepts TORCH_HCCL_* once settings pass it through)
    mine = as_dict(hccl_flight_recorder(variables, {"TORCH_HCCL_TRACE_BUFFER_SIZE": "0"}))
    assert mine["TORCH_HCCL_TRACE_BUFFER_SIZE"] == "0" and mine["TORCH_HCCL_DUMP_ON_TIMEOUT"] == "1"


def test_the_dump_signal_is_torch_npus_key_in_the_jobs_store() -> None:
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    worker_deadline.signal_flight_recorder(f"127.0.0.1:{server.port}", 37)
    assert server.check([worker_deadline.FLIGHT_RECORDER_SIGNAL])
    assert struct.unpack("=i", server.get(worker_deadline.FLIGHT_RECORDER_SIGNAL)) == (37,)  # int32 rank


def test_the_report_says_where_the_dumps_are_only_when_the_workers_have_them() -> None:
    board = DictBoard()
    on = {
        "TORCH_HCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_HCCL_ENABLE_MONITORING": "1",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29444",
    }
    Heartbeat(board, "a", process_identity(12, on), 1.0).beat()
    Heartbeat(board, "b", process_identity(13, {}), 1.0).beat()
    now = [0.0]
    watch = CallWatch("update_actor", 1, {"a": "w0", "b": "w1"}, 30, board, clock=lambda: now[0])
    watch.observe(["a", "b"])
    assert worker_deadline.flight_recorder_note(watch, ["b"]) == ""
    note = worker_deadline.flight_recorder_note(watch, ["a", "b"])
    assert note.startswith(
        "HCCL flight recorder dump requested from every live rank: /tmp/hccl_trace_rank_<rank> on "
        "each node, Python stacks in /tmp/hccl_trace_rank_<rank>_py_traceback"
    )
    assert json.loads(board.values["a"])["store"] == "10.0.0.1:29444"


def test_the_audit_lists_what_is_watched_and_how(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TIMEOUT_ENV, "60")
    w = watched()
    assert w["timeout"]["value"] == "60 s" and "func_generator" in w["driver"]
    points = " ".join(p["point"] for p in w["progress_points"])
    for what in ("update_actor", "micro-batch", "bucket", "engine step", "weight_sync", "d2d_reshard"):
        assert what in points
    assert any("torch.distributed collectives" in n["what"] for n in w["not_watched"])
    monkeypatch.delenv(TIMEOUT_ENV)
    assert watched()["timeout"]["value"] == "unset: diagnosis off"


def test_the_launcher_repeats_the_report_as_its_last_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from argparse import Namespace

    from verl_patches.launch.job import Launch, say_hang_report

    settings = load_settings({"LOG_DIR": str(tmp_path)}, None, environ={})
    launch = Launch(Namespace(tiny=True, profile="a3_256die_random_init"), settings, "local")
    (launch.log_dir / "trainer.log").write_text(
        "step:1 - a:1\n(TaskRunner pid=5) verl_patches hang: update_actor (step 2) made no progress\n"
        "ray.exceptions.RayTaskError(WorkerHangError): ... verl_patches hang: update_actor (step 2) made no progress\n"
        "(raylet) something else\n"
    )
    say_hang_report(launch, 0)
    assert capsys.readouterr().out == ""
    say_hang_report(launch, 1)
    assert capsys.readouterr().out.rstrip().endswith("] verl_patches hang: update_actor (step 2) made no progress")
