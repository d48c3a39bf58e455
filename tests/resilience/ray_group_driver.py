"""A driver with real verl RayWorkerGroups of three workers on a private local Ray cluster (run as a script
by test_ray_worker_deadline.py with one or more modes; prints one JSON line per mode).

Each mode gets a group of its own on the one Ray cluster, made once the previous mode's group and its placement
group are removed: `work(step, mode)`: every rank goes through four micro-batches of the "update" phase; rank 1
stops there per `mode` (frozen: SIGSTOP; dies: SIGKILL; slow: 0.7 time-out per micro-batch, alive; none). The
other ranks finish, except in mode peers_fail: rank 1 dies a second after the others raised, as gloo's peers of a
killed rank do ("Connection reset by peer") before Ray has reported the death. The driver's call goes through
verl's worker-group method, i.e. our bounded func_generator.
"""

from __future__ import annotations

import json
import os
import sys
import time

import verl_patches.prelude_patch  # noqa: F401  (our patches in this driver, as in the trainer's)

# isort: split
import ray
from ray.util.placement_group import remove_placement_group

from verl_patches.patching.ray_runtime import runtime_env

modes = sys.argv[1:]
ray.init(
    address="local", num_cpus=4, num_gpus=3, include_dashboard=False, runtime_env=runtime_env(), log_to_driver=False
)
try:
    from verl.single_controller.base import Worker
    from verl.single_controller.base.decorator import Dispatch, register
    from verl.single_controller.ray.base import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    class Toy(Worker):
        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def work(self, step: int, mode: str) -> int:
            import signal

            from verl_patches.resilience import progress

            timeout = float(os.environ["VERL_PATCHES_COLLECTIVE_TIMEOUT_S"])
            progress.enter_call("update_actor", step, "update")
            progress.begin_group()
            for micro in range(1, 5):
                if self.rank == 1 and micro == 3:
                    if mode == "frozen":
                        os.kill(os.getpid(), signal.SIGSTOP)
                    elif mode == "dies":
                        os.kill(os.getpid(), signal.SIGKILL)
                    elif mode == "peers_fail":
                        time.sleep(1.0)
                        os.kill(os.getpid(), signal.SIGKILL)
                elif mode == "peers_fail" and micro == 3:
                    raise RuntimeError("[gloo/transport/tcp/pair.cc:525] Read error [127.0.0.1]:7066: Connection reset")
                progress.unit("micro-batch", micro, 4)
                time.sleep(0.7 * timeout if (self.rank == 1 and mode == "slow") else 0.3)
            progress.leave_call()
            return os.getpid()

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def pid(self) -> int:
            return os.getpid()

    for mode in modes:
        out: dict = {"mode": mode}
        pool = RayResourcePool([3], use_gpu=True, max_colocate_count=1)
        wg = RayWorkerGroup(pool, RayClassWithInitArgs(cls=ray.remote(Toy)), device_name="cpu")
        out["patched"] = type(wg.work).__mro__[1].__module__
        pids = wg.pid()
        out["pids"] = pids
        t0 = time.monotonic()
        try:
            out["result"] = wg.work(7, mode)
        except Exception as e:
            out["error"] = f"{type(e).__name__}: {e}"
        out["elapsed"] = time.monotonic() - t0
        time.sleep(3)
        out["alive_after"] = [
            p for p in pids if os.path.exists(f"/proc/{p}") and open(f"/proc/{p}/stat").read().split()[2] != "Z"
        ]
        for pg in pool.pgs:  # ends what is left of this group (nothing after a time-out) and frees its slots
            remove_placement_group(pg)
        print("RESULT " + json.dumps(out), flush=True)
finally:
    ray.shutdown()
