"""A driver with a real verl RayWorkerGroup of three workers on a private local Ray cluster (run as a script
by test_ray_worker_deadline.py; prints one JSON line).

`work(step, mode)`: every rank goes through four micro-batches of the "update" phase; rank 1 stops there
per `mode` (frozen: SIGSTOP; dies: SIGKILL; slow: 0.7 time-out per micro-batch, alive; none). The other
ranks finish. The driver's call goes through verl's worker-group method, i.e. our bounded func_generator.
"""

from __future__ import annotations

import json
import os
import sys
import time

import verl_patches.prelude_patch  # noqa: F401  (our patches in this driver, as in the trainer's)

import ray

from verl_patches.patching.ray_runtime import runtime_env

mode = sys.argv[1]
ray.init(
    address="local", num_cpus=4, num_gpus=3, include_dashboard=False, runtime_env=runtime_env(), log_to_driver=False
)
out: dict = {"mode": mode}
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
                progress.unit("micro-batch", micro, 4)
                time.sleep(0.7 * timeout if (self.rank == 1 and mode == "slow") else 0.3)
            progress.leave_call()
            return os.getpid()

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def pid(self) -> int:
            return os.getpid()

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
finally:
    ray.shutdown()
print("RESULT " + json.dumps(out), flush=True)
