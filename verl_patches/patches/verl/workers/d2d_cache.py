"""The D2D tensor cache inside verl's Megatron ``ActorRolloutRefWorker`` (vendor items C1 and C2, with
A2's driver payloads in `verl_patches.worker_calls.step_payloads`).

A call takes part in the D2D flow when the driver says so (``meta_info[D2D_META_KEY]``, written by our fit
loop) and it is not a validation call (``meta_info["validate"]``); every other call runs upstream's method
untouched. In one training step, on every rank of the fused actor/rollout/ref worker group:

* ``generate_sequences`` (DP_COMPUTE_PROTO: this rank's rollout chunk is chunk ``rank``) caches
  `CACHED_BY_GENERATE` on the device in the rollout row layout and hands the driver only
  `GENERATE_TO_DRIVER_WITH_D2D` of them (plus any key the cache does not take);
* ``compute_ref_log_prob`` (MEGATRON_COMPUTE_PROTO) gets a tensor-less batch of its Megatron DP slice's
  size; it takes `REF_INPUTS` from the cache, resharded once into the Megatron DP layout (C2) with the
  dispatch's map of global rank -> DP rank (B1, ``meta_info["global_megatron_dp_ranks"]``), runs
  upstream's method, caches ``ref_log_prob`` and returns a batch with no tensor;
* ``update_actor`` unions `UPDATE_FROM_CACHE` with the driver's ``advantages`` (and meta_info:
  ``global_token_num``, temperature, ...) and runs upstream's method (under our temperature wrapper);
  the cache is cleared afterwards.

The reshard's rows are exactly those the driver's concat + split would have delivered, so D2D changes no
number. A failed call clears the cache (the next step must not meet stale entries, and the cache refuses
a re-put); a generate that finds entries left by an unfinished step drops them with a warning.

Upstream's methods move their outputs to the host; the cached copies are moved back to the device
(`verl_patches.device.torch_device`), because the reshard's all-to-all runs on the device's backend
(HCCL takes no host tensors). That is one small host round trip per tensor inside the worker, instead of
the vendor's replaced methods; the trip through the driver (Ray's serial dispatch to every rank) is what
D2D removes.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from verl_patches.device import torch_device
from verl_patches.reshard.dp_plan import DpRankMap
from verl_patches.reshard.errors import TensorCacheError, TensorCachePreconditionError
from verl_patches.reshard.tensor_cache import TensorCache
from verl_patches.resilience import progress
from verl_patches.worker_calls.meta_keys import D2D_META_KEY, DP_RANKS_META_KEY
from verl_patches.worker_calls.step_payloads import (
    CACHED_BY_GENERATE,
    GENERATE_TO_DRIVER_WITH_D2D,
    OPTIONAL_FROM_GENERATE,
    REF_INPUTS,
    REF_OUTPUT,
    UPDATE_FROM_CACHE,
)

logger = logging.getLogger("verl_patches")

CACHE_ATTR = "_verl_patches_tensor_cache"


class D2DFlowError(TensorCacheError, RuntimeError):
    """A D2D call arrived out of order, or without what it needs from the driver."""


def is_d2d_call(data: Any) -> bool:
    """The driver asked for the D2D flow on this call, and it is not a validation call."""
    meta = getattr(data, "meta_info", None) or {}
    return bool(meta.get(D2D_META_KEY, False)) and not bool(meta.get("validate", False))


def check_worker_preconditions(worker: Any) -> None:
    """What the worker can see of the D2D preconditions (the driver's config checks cover the rest)."""
    a = "actor_rollout_ref.actor"
    violations: dict[str, str] = {}
    if not (
        getattr(worker, "_is_actor", False)
        and getattr(worker, "_is_rollout", False)
        and getattr(worker, "_is_ref", False)
    ):
        violations["overlay.fused_actor_rollout_ref"] = (
            "must be true: generate, ref and update must run in one worker (role actor_rollout_ref) to share the cache"
        )
    actor = worker.config.actor
    if not actor.get("use_kl_loss", False):
        violations[f"{a}.use_kl_loss"] = "must be true: the update reads ref_log_prob from the cache"
    if actor.get("recompute_old_log_prob", True) is not False:
        violations[f"{a}.recompute_old_log_prob"] = "must be false: the old-log-prob pass needs the batch on the driver"
    if actor.get("ppo_epochs", 1) != 1:
        violations[f"{a}.ppo_epochs"] = "must be 1: the cache holds one step's batch for one update"
    if violations:
        raise TensorCachePreconditionError(violations)


def cache_of(worker: Any) -> TensorCache | None:
    return getattr(worker, CACHE_ATTR, None)


def cache_for_generate(worker: Any, local_rows: int) -> TensorCache:
    """The worker's one cache, built (preconditions first) on the first D2D generate and re-planned only if
    the step's batch size changes; left-over entries of an unfinished step are dropped."""
    cache = cache_of(worker)
    if cache is not None and len(cache):
        logger.warning(
            "rank %s: D2D tensor cache still held %s from an unfinished step; dropped", worker.rank, cache.keys()
        )
        cache.clear()
    world = int(worker.world_size)
    if cache is None or cache.global_rows != local_rows * world:
        if cache is None:
            check_worker_preconditions(worker)
        # the Megatron DP map arrives with the first MEGATRON_COMPUTE_PROTO call (B1); until then the plan
        # only has to know the rollout chunk sizes, one per rank
        cache = TensorCache(DpRankMap(tuple(range(world))), int(worker.rank), local_rows * world)
        setattr(worker, CACHE_ATTR, cache)
        if int(worker.rank) == 0:  # one line per job in the log, saying the path ran
            print(
                f"verl_patches D2D tensor cache on (rank 0 of {world}): {local_rows} rollout rows per rank, "
                f"{local_rows * world} per step; ref and update read them resharded to the Megatron DP layout",
                flush=True,
            )
    return cache


def _cache_in_step(worker: Any, call: str) -> TensorCache:
    cache = cache_of(worker)
    if cache is None or not len(cache):
        raise D2DFlowError(
            f"rank {worker.rank}: {call} with the D2D flow, but generate_sequences cached nothing "
            f"in this step (the driver must run generate with meta_info[{D2D_META_KEY!r}]=True first)"
        )
    return cache


def _dp_ranks(worker: Any, data: Any, call: str) -> list[int]:
    ranks = data.meta_info.get(DP_RANKS_META_KEY)
    if ranks is None:
        raise D2DFlowError(
            f"rank {worker.rank}: {call} with the D2D flow needs meta_info[{DP_RANKS_META_KEY!r}] (the "
            f"MEGATRON_COMPUTE_PROTO dispatch patch writes it); it is missing"
        )
    return list(ranks)


def _check_rows(worker: Any, data: Any, cache: TensorCache, call: str) -> None:
    if len(data) != cache.rows_per_dp_rank:
        raise D2DFlowError(
            f"rank {worker.rank}: {call} got {len(data)} rows from the driver, the cached batch has "
            f"{cache.rows_per_dp_rank} per Megatron DP rank (did the driver reorder or pad the batch?)"
        )


def _with_cached(data: Any, cached: Any) -> Any:
    """The driver's DataProto with the cached tensors added (a fresh, unlocked TensorDict; same meta_info)."""
    # deferred: a patch applies while upstream is still importing; verl is read at call time
    from verl import DataProto

    tensors = dict(cached.batch.items())
    if data.batch is not None:
        clash = sorted(set(data.batch.keys()) & set(tensors))
        if clash:
            raise D2DFlowError(f"the driver shipped {clash}, which the D2D cache also holds")
        tensors.update(data.batch.items())
    return DataProto.from_dict(tensors=tensors, non_tensors=dict(data.non_tensor_batch), meta_info=data.meta_info)


def _device() -> Any:
    return torch_device()


def wrap_generate_sequences(original: Callable) -> Callable:
    @functools.wraps(original)  # keeps verl's dispatch registration attributes
    def generate_sequences(self: Any, prompts: Any, *args: Any, **kwargs: Any) -> Any:
        if not is_d2d_call(prompts):
            return original(self, prompts, *args, **kwargs)
        output = original(self, prompts, *args, **kwargs)
        keys = list(output.batch.keys())
        missing = [k for k in CACHED_BY_GENERATE if k not in keys and k not in OPTIONAL_FROM_GENERATE]
        if missing:
            raise D2DFlowError(
                f"rank {self.rank}: generate_sequences returned no {missing} (has {sorted(keys)}); the "
                f"D2D cache needs them for ref and update"
            )
        cache = cache_for_generate(self, len(output))
        try:
            cache.cache_tensors(
                output,
                keys=[k for k in CACHED_BY_GENERATE if k in keys],
                keys_to_reserve=GENERATE_TO_DRIVER_WITH_D2D,
                device=_device(),
            )
        except BaseException:
            cache.clear()
            raise
        return output

    return generate_sequences


def wrap_compute_ref_log_prob(original: Callable) -> Callable:
    @functools.wraps(original)
    def compute_ref_log_prob(self: Any, data: Any, *args: Any, **kwargs: Any) -> Any:
        if not is_d2d_call(data):
            return original(self, data, *args, **kwargs)
        # lazy: tensordict is heavy and only this path needs it; importing this module stays light
        from tensordict import TensorDict

        # deferred: a patch applies while upstream is still importing; verl is read at call time
        from verl import DataProto

        cache = _cache_in_step(self, "compute_ref_log_prob")
        try:
            progress.phase("d2d_reshard")  # hang diagnosis: the reshard is collectives
            inputs = cache.get(REF_INPUTS, _dp_ranks(self, data, "compute_ref_log_prob"))
            _check_rows(self, data, cache, "compute_ref_log_prob")
            progress.phase("ref")
            out = original(self, _with_cached(data, inputs), *args, **kwargs)
            cache.put(REF_OUTPUT, out.batch[REF_OUTPUT].to(_device()), layout="megatron_dp")
            if int(self.rank) == 0 and not getattr(self, "_verl_patches_d2d_reported", False):
                self._verl_patches_d2d_reported = True
                print(f"verl_patches D2D rank 0 after ref: {cache.size_report()}", flush=True)
        except BaseException:
            cache.clear()
            raise
        # the driver unions this into its batch: its size, nothing else
        return DataProto(batch=TensorDict({}, batch_size=[len(data)]), meta_info=dict(out.meta_info))

    return compute_ref_log_prob


def wrap_update_actor(original: Callable) -> Callable:
    @functools.wraps(original)
    def update_actor(self: Any, data: Any, *args: Any, **kwargs: Any) -> Any:
        if not is_d2d_call(data):
            return original(self, data, *args, **kwargs)
        cache = _cache_in_step(self, "update_actor")
        try:
            # same keys in the same order on every rank: a rollout-layout entry's reshard is a collective
            keys = [k for k in UPDATE_FROM_CACHE if k not in OPTIONAL_FROM_GENERATE or k in cache]
            progress.phase("d2d_reshard")
            cached = cache.get(keys, _dp_ranks(self, data, "update_actor"))
            _check_rows(self, data, cache, "update_actor")
            progress.phase("update")
            return original(self, _with_cached(data, cached), *args, **kwargs)
        finally:
            cache.clear()

    return update_actor
