"""What the driver ships to each worker call of a step (pure; vendor item A2 with C2's D2D cache).

Without D2D every call gets the driver's whole batch, as upstream. With D2D the rollout tensors stay in
the workers' TensorCache, so:

* ``compute_ref_log_prob`` gets a DataProto with the batch size and the meta_info but no tensor (the
  workers read responses/input_ids/attention_mask/position_ids from their cache and keep ref_log_prob
  there);
* ``update_actor`` gets ``advantages`` and the whole meta_info (``global_token_num``, ``multi_turn``,
  ...; the workers add the cached tensors).

The driver never ships `NEVER_SHIPPED_WITH_D2D` in either call; `payload_keys` states it as data for
tests and logs. The worker side (verl_patches.patches.verl.workers.d2d_cache) follows the key lists here:
generate caches `CACHED_BY_GENERATE` and hands the driver only `GENERATE_TO_DRIVER_WITH_D2D` of them
(the reward needs prompts/responses/attention_mask; the response mask and ``global_token_num`` come from
responses/attention_mask); ref reads `REF_INPUTS` and caches ``ref_log_prob``; update reads
`UPDATE_FROM_CACHE` (the optional ``rollout_log_probs`` only where generate produced it: the actor's
rollout/train log-prob mismatch) besides the driver's ``advantages``.

Every worker call of a step carries ``meta_info[STEP_META_KEY]`` (the trainer step, for the collective
watchdog's hang report) and ``meta_info[D2D_META_KEY]`` (whether this call takes part in the D2D flow):
`stamp` writes both.
"""

from __future__ import annotations

import copy
from typing import Any

from verl_patches.worker_calls.meta_keys import D2D_META_KEY, STEP_META_KEY

NEVER_SHIPPED_WITH_D2D = ("input_ids", "position_ids", "ref_log_prob", "old_log_probs")
UPDATE_KEYS_WITH_D2D = ("advantages",)

CACHED_BY_GENERATE = ("responses", "input_ids", "attention_mask", "position_ids", "rollout_log_probs")
OPTIONAL_FROM_GENERATE = ("rollout_log_probs",)  # verl's vLLM rollout and our stand-in return it
GENERATE_TO_DRIVER_WITH_D2D = ("prompts", "responses", "attention_mask")
REF_INPUTS = ("responses", "input_ids", "attention_mask", "position_ids")
REF_OUTPUT = "ref_log_prob"
UPDATE_FROM_CACHE = REF_INPUTS + (REF_OUTPUT, "rollout_log_probs")


def stamp(data: Any, step: int, d2d: bool) -> Any:
    """Write the trainer step and the D2D flag into ``data.meta_info`` (in place); returns ``data``."""
    data.meta_info[STEP_META_KEY] = int(step)
    data.meta_info[D2D_META_KEY] = bool(d2d)
    return data


def payload_keys(call: str, batch_keys: list[str], d2d: bool) -> list[str]:
    """Tensor keys a worker call receives, given the driver's batch keys (pure)."""
    if call not in ("compute_ref_log_prob", "update_actor"):
        raise ValueError(f"payload_keys: unknown call {call!r}")
    if not d2d:
        return list(batch_keys)
    if call == "compute_ref_log_prob":
        return []
    missing = [k for k in UPDATE_KEYS_WITH_D2D if k not in batch_keys]
    if missing:
        raise KeyError(f"update_actor with D2D needs {missing} in the driver's batch (has {sorted(batch_keys)})")
    return list(UPDATE_KEYS_WITH_D2D)


def _restricted(batch: Any, keys: list[str]) -> Any:
    # lazy: tensordict is heavy and only this path needs it; importing this module stays light
    from tensordict import TensorDict

    # deferred: importing this module must not load verl; it loads once the prelude patched it
    from verl import DataProto

    tensors = TensorDict({k: batch.batch[k] for k in keys}, batch_size=[len(batch)])
    return DataProto(batch=tensors, non_tensor_batch={}, meta_info=copy.copy(batch.meta_info))


def ref_payload(batch: Any, d2d: bool) -> Any:
    """The DataProto for ``compute_ref_log_prob``."""
    if not d2d:
        return batch
    return _restricted(batch, payload_keys("compute_ref_log_prob", list(batch.batch.keys()), d2d))


def update_payload(batch: Any, d2d: bool) -> Any:
    """The DataProto for ``update_actor``."""
    if not d2d:
        return batch
    return _restricted(batch, payload_keys("update_actor", list(batch.batch.keys()), d2d))
