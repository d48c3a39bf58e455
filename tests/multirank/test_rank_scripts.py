"""`run_rank_scripts`: ranks that are a script or a module with their own argv and environment, under the same
supervision as `run_ranks`: each rank's output back in rank order, a failed rank named with the end of its
output, hung ranks stopped at one deadline for all with their stacks shown, the teardown rule applied after the
script returns, and a job taken down as a cluster takes it (a rank died: its peers at once; killed from outside)."""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import pytest

from verl_patches.multirank import STOPPED, RankFailure, RankRun, run_rank_scripts

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(180)]

# Every script below writes its pid to <folder>/<rank>.pid first, so the test can check that none outlives the run.
PID_LINE = (
    "import os, sys, time\nopen(os.path.join(sys.argv[1], os.environ['RANK'] + '.pid'), 'w').write(str(os.getpid()))\n"
)


def _script(tmp_path: Path, body: str, name: str = "rank_script.py") -> Path:
    path = tmp_path / name
    path.write_text(PID_LINE + textwrap.dedent(body))
    return path


def _assert_ranks_gone(folder: Path, world: int) -> None:
    for r in range(world):
        pid = int((folder / f"{r}.pid").read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_each_rank_runs_the_script_with_its_argv_and_environment(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        """
        import json
        names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "RANK_SCRIPTS_TEST")
        seen = {"argv": sys.argv[2:], "env": {k: os.environ.get(k) for k in names}, "path0": sys.path[0]}
        print(json.dumps(seen), flush=True)
        print("and a line on stderr", file=sys.stderr)
        """,
    )
    env = [{"LOCAL_RANK": None, "RANK_SCRIPTS_TEST": "a"}, {"RANK_SCRIPTS_TEST": "b"}]
    runs = run_rank_scripts(script, 2, 60, args=lambda r: [str(tmp_path), f"--rank={r}", "two words"], rank_env=env)
    assert [(run.status, run.killed) for run in runs] == [(0, ""), (0, "")]
    for r, run in enumerate(runs):
        first, *rest = run.output.splitlines()
        assert rest == ["and a line on stderr"]  # stdout and stderr, together
        assert json.loads(first) == {
            "argv": [f"--rank={r}", "two words"],  # arguments as argv, whatever they hold
            "env": {
                "RANK": str(r),
                "LOCAL_RANK": None if r == 0 else "1",
                "WORLD_SIZE": "2",
                "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "RANK_SCRIPTS_TEST": "ab"[r],
            },
            "path0": str(tmp_path),  # the script's folder first, as `python SCRIPT` has it
        }


def test_a_module_runs_as_python_m_runs_it_and_its_exit_status_is_its_rank_s(tmp_path: Path) -> None:
    package = tmp_path / "rank_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    _script(package, "print(__name__, os.path.basename(sys.argv[0]))\nsys.exit(int(sys.argv[2]))\n", "probe.py")
    runs = run_rank_scripts(
        "rank_pkg.probe", 2, 60, module=True, args=lambda r: [str(tmp_path), str(4 * r)], cwd=tmp_path, check=False
    )
    assert [run.status for run in runs] == [0, 4]
    assert all(run.output == "__main__ probe.py\n" for run in runs), runs


def test_the_rank_ends_once_its_script_returns_without_interpreter_teardown(tmp_path: Path) -> None:
    """A thread the interpreter's teardown would wait for (as it waits in a gloo group's destructor) holds nothing."""
    script = _script(
        tmp_path,
        """
        import threading
        threading.Thread(target=time.sleep, args=(600,)).start()  # not a daemon: a normal exit would wait
        print("returned", flush=True)
        """,
    )
    start = time.monotonic()
    runs = run_rank_scripts(script, 1, 60, args=[str(tmp_path)])
    assert time.monotonic() - start < 30
    assert runs == [RankRun(0, "returned\n")]


def test_a_failed_rank_is_named_with_the_end_of_its_output(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        """
        if os.environ["RANK"] == "1":
            print("rank one's last words", flush=True)
            raise ValueError("rank one refuses its input")
        """,
    )
    with pytest.raises(RankFailure) as info:
        run_rank_scripts(script, 2, 60, args=[str(tmp_path)])
    text = str(info.value)
    assert (info.value.ranks, info.value.hung) == ([1], [])
    assert text.startswith("1 of 2 ranks failed: rank 1 exited with status 1\n")
    assert "rank one's last words" in text and "ValueError: rank one refuses its input" in text
    _assert_ranks_gone(tmp_path, 2)


HANGS = """
def sleep_forever_in_script():
    while True:
        time.sleep(1)

if os.environ["RANK"] != "0":
    print("going to sleep", flush=True)
    sleep_forever_in_script()
"""


def test_hung_script_ranks_fail_at_one_deadline_for_all_with_their_stacks(
    tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    deadline = 10.0
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run_rank_scripts(_script(tmp_path, HANGS), 3, deadline, args=[str(tmp_path)])
    elapsed = time.monotonic() - start
    assert deadline <= elapsed < 1.5 * deadline  # one deadline, not one per hung rank in turn (2 x 10 s)
    assert (info.value.ranks, info.value.hung) == ([1, 2], [1, 2])
    text = str(info.value)
    for r in (1, 2):
        assert f"rank {r} was still running at the deadline (10 s for all 3 ranks together)" in text
    assert text.count("in sleep_forever_in_script") == 2  # each hung rank's stack, where it hangs
    assert text.count("going to sleep") == 2  # and the end of its output
    printed = capfd.readouterr().err  # printed as soon as the deadline passed, with the rank number
    assert "rank 1 (pid" in printed and "rank 2 (pid" in printed and "in sleep_forever_in_script" in printed
    _assert_ranks_gone(tmp_path, 3)


def test_without_check_a_dead_rank_takes_its_peers_down_at_once_and_they_are_returned(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        """
        ready = os.path.join(sys.argv[1], "rank0.ready")
        if os.environ["RANK"] == "0":
            open(ready, "w").close()
            while True:  # as a peer waiting in a collective for the rank that died
                time.sleep(1)
        while not os.path.exists(ready):  # rank 0 has its stack dump set up by now
            time.sleep(0.05)
        print("rank one dies", flush=True)
        sys.exit(3)
        """,
    )
    start = time.monotonic()
    runs = run_rank_scripts(script, 2, 120, args=[str(tmp_path)], check=False, peer_grace_s=0)
    assert time.monotonic() - start < 60  # not the deadline
    assert (runs[0].status, runs[0].killed) == (-9, "0 s after rank 1 failed")
    assert runs[1] == RankRun(3, "rank one dies\n")
    _assert_ranks_gone(tmp_path, 2)


def test_stop_kills_every_rank_at_once_without_taking_it_for_a_hang(
    tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    script = _script(
        tmp_path,
        """
        if os.environ["RANK"] == "1":
            open(os.path.join(sys.argv[1], ".kill_job"), "w").close()
        while True:
            time.sleep(1)
        """,
    )
    marker = tmp_path / ".kill_job"
    runs = run_rank_scripts(script, 2, 120, args=[str(tmp_path)], check=False, stop=marker.exists)
    assert [(run.status, run.killed) for run in runs] == [(-9, STOPPED), (-9, STOPPED)]
    assert "still running" not in capfd.readouterr().err  # no stacks asked for: a stop is not a hang
    _assert_ranks_gone(tmp_path, 2)
    marker.unlink()
    with pytest.raises(RankFailure, match=r"^2 of 2 ranks failed: rank 0 was stopped"):
        run_rank_scripts(script, 2, 120, args=[str(tmp_path)], stop=marker.exists)  # with check, a failure
