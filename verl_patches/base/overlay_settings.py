"""The ``overlay:`` section of a composed trainer config as one typed value: `overlay_settings`.

verl has no ``overlay`` section: every key in it is ours (ppo_mindspeed_trainer.yaml, the profiles, the tiny
configs), read by the driver, the launch, the preflight and the patches. `SETTINGS` lists each key once, with
its type and default; `overlay_settings` reads the section against it, so a misspelt key
(``overlay.vllm_dp_sise``) or a value of the wrong type (``overlay.async_checkpoint=yes``) is refused in one
line naming the key, instead of being read as its default where it is used.

Standard library only (`base`): the config is anything with ``.get`` and ``in`` (an OmegaConf node, a dict).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from verl_patches.base.config_access import get

SECTION = "overlay"
VLLM_DP_KEY = f"{SECTION}.vllm_dp_size"


class OverlaySettingError(ValueError):
    """An ``overlay.*`` key that is not ours, or a value of the wrong type; one line starting with the key,
    which ``key`` holds."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class OverlaySettings:
    """Every ``overlay.*`` setting, typed; an absent key takes the default shown."""

    # the profile's name (a3-256die-true-weight, tiny, ...; `custom` in the bare config): the vendor's figures
    # and the tiny run's own paths are chosen by it
    profile: str | None = None
    # NPU dies per card, for the per-card throughput (Atlas A3: 2)
    dies_per_card: int = 1
    # one actor_rollout_ref worker group plays actor, rollout and reference (vendor item A1)
    fused_actor_rollout_ref: bool = False
    # rollout tensors stay on the workers between generate, ref and update (vendor items A2, C1, C2)
    d2d_tensor_cache: bool = False
    # validate on a fixed seeded sample of at most this many prompts; None: the whole split
    val_max_prompts: int | None = None
    # engines per vLLM instance (VLLM_DP_SIZE): the instance's expert parallelism; None: one engine each
    vllm_dp_size: int | None = None
    # checkpoints written in the background, fenced before the next update
    async_checkpoint: bool = False
    # warn/stop bounds on the rollout/training log-prob gap (its reader: the driver's mismatch gate)
    rollout_mismatch_gate: Mapping[str, Any] | None = field(default=None, hash=False)  # a mapping has no hash
    # the tiny run's assets (data, tokenizer, model, checkpoint), built on first use
    tiny_assets_dir: str | None = None
    tiny_seed: int | None = None
    tiny_max_operand: int | None = None
    # supervised steps that make the tiny run's weak base model; 0: RL starts from the random model
    tiny_base_steps: int = 0


# field -> (the types it takes, the smallest integer it takes or None, what the refusal says it expects)
SETTINGS: dict[str, tuple[tuple[type, ...], int | None, str]] = {
    "profile": ((str,), None, "a profile name (text)"),
    "dies_per_card": ((int,), 1, "an integer >= 1"),
    "fused_actor_rollout_ref": ((bool,), None, "true or false"),
    "d2d_tensor_cache": ((bool,), None, "true or false"),
    "val_max_prompts": ((int,), 1, "an integer >= 1, or null (the whole split)"),
    "vllm_dp_size": ((int,), 1, "an integer >= 1, or null (one engine per instance)"),
    "async_checkpoint": ((bool,), None, "true or false"),
    "rollout_mismatch_gate": ((Mapping,), None, "a mapping of `warn` / `stop` bounds, or null (no gate)"),
    "tiny_assets_dir": ((str,), None, "a folder path (text)"),
    "tiny_seed": ((int,), 0, "an integer >= 0"),
    "tiny_max_operand": ((int,), 1, "an integer >= 1"),
    "tiny_base_steps": ((int,), 0, "an integer >= 0"),
}
# the fields that have no null: a null there is refused rather than read as the default
NOT_NULL = frozenset({"dies_per_card", "fused_actor_rollout_ref", "d2d_tensor_cache", "async_checkpoint"})


def _plain(value: Any) -> Any:
    """An OmegaConf node (or any mapping / list) as plain dicts and lists, so the settings hold no live node."""
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        return value
    return [_plain(v) for v in value]  # a list, a tuple or an OmegaConf ListConfig


def _checked(name: str, value: Any) -> Any:
    key = f"{SECTION}.{name}"
    types, minimum, expected = SETTINGS[name]
    if value is None:
        if name in NOT_NULL:
            raise OverlaySettingError(key, f"{key}=null: expected {expected}")
        return None
    if hasattr(value, "items") and Mapping in types:
        return MappingProxyType(_plain(value))
    wrong_bool = isinstance(value, bool) and bool not in types  # True is an int to Python, not to a config
    if wrong_bool or not isinstance(value, types):
        raise OverlaySettingError(key, f"{key}={value!r}: expected {expected}, got {type(value).__name__}")
    if minimum is not None and isinstance(value, int) and value < minimum:
        raise OverlaySettingError(key, f"{key}={value!r}: expected {expected}")
    return value


def overlay_settings(cfg: Any) -> OverlaySettings:
    """The typed ``overlay`` section of ``cfg`` (the defaults where it has none); `OverlaySettingError` names the
    first unknown key or ill-typed value."""
    section = get(cfg, SECTION)
    if section is None:
        return OverlaySettings()
    if not hasattr(section, "items"):
        raise OverlaySettingError(SECTION, f"{SECTION}={section!r}: expected a mapping of overlay settings")
    known = [f.name for f in fields(OverlaySettings)]
    values: dict[str, Any] = {}
    for name in section:
        name = str(name)
        if name not in SETTINGS:
            near = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {SECTION}.{near[0]}?" if near else f" (the overlay keys: {', '.join(known)})"
            raise OverlaySettingError(f"{SECTION}.{name}", f"{SECTION}.{name}: not an overlay setting{hint}")
        values[name] = _checked(name, section.get(name))
    return OverlaySettings(**values)
