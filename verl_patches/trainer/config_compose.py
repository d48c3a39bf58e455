"""Compose our trainer configs on top of verl's own, through Hydra, without touching verl's tree."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from verl_patches.base.overlay_settings import OverlaySettingError, overlay_settings
from verl_patches.device import device_kind
from verl_patches.driver.rollout_settings import seqs_per_rollout_engine
from verl_patches.trainer.override_suggest import nearest_key, unknown_key_message, unknown_override_key

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = Path(__file__).resolve().parent / "config"
VERL_CONFIG_DIR = REPO_ROOT / "verl" / "trainer" / "config"
CONFIG_NAMES = ("ppo_mindspeed_trainer", "ppo_tiny_local", "ppo_tiny_local_fsdp")


class ConfigCompositionError(ValueError):
    """An override or a profile that does not compose; one line, naming the key (Hydra's message, joined)."""


def _one_line(err: BaseException) -> str:
    return "; ".join(line.strip() for line in str(err).splitlines() if line.strip()) or type(err).__name__


def register_resolvers() -> None:
    """${overlay_root:} is the repo root (absolute, so Ray workers resolve paths the same way anywhere);
    ${overlay_device:} is npu/cuda/cpu as the device layer sees this host."""

    def _device() -> str:
        return device_kind()

    OmegaConf.register_new_resolver("overlay_root", lambda: str(REPO_ROOT), replace=True)
    OmegaConf.register_new_resolver("overlay_device", _device, replace=True)
    # ${overlay_seqs_per_rollout_engine:tbs,n,nnodes,gpus_per_node,rollout_tp}: rollout.max_num_seqs
    OmegaConf.register_new_resolver("overlay_seqs_per_rollout_engine", seqs_per_rollout_engine, replace=True)


def compose_config(config_name: str = "ppo_mindspeed_trainer", overrides: list[str] | None = None) -> DictConfig:
    """The composed config, interpolations left in place (verl resolves them in its TaskRunner)."""
    # lazy: Hydra is heavy and only this path needs it; importing this module stays light
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    if not VERL_CONFIG_DIR.is_dir():
        raise ConfigCompositionError(f"{VERL_CONFIG_DIR} is missing: run `bash setup_sources.sh` first")
    register_resolvers()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            return compose(
                config_name=config_name, overrides=[f"hydra.searchpath=[file://{VERL_CONFIG_DIR}]", *(overrides or [])]
            )
    except (HydraException, OmegaConfBaseException) as e:
        suggestion = _unknown_key_error(config_name, overrides or [], str(e))
        raise ConfigCompositionError(suggestion or f"config {config_name!r}: {_one_line(e)}") from None
    finally:
        GlobalHydra.instance().clear()


def _unknown_key_error(config_name: str, overrides: list[str], message: str) -> str | None:
    """For an override whose key the config lacks: one line naming the nearest key, in place of Hydra's advice
    to add the misspelt key with '+' (verl_patches.trainer.override_suggest). None for any other error."""

    key = unknown_override_key(message)
    if key is None:
        return None
    line = next((o for o in overrides if o.lstrip("~+").split("=", 1)[0] == key), None)
    groups = [o for o in overrides if "=" in o and _is_group_override(o.split("=", 1)[0])]
    try:  # the config the value overrides apply to: verl's and ours with the chosen profile
        base = OmegaConf.to_container(compose_config(config_name, groups), resolve=False)
    except ConfigCompositionError:
        return None
    return unknown_key_message(config_name, key, line, nearest_key(base, key))


def _leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}{k}.")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _leaves(v, f"{prefix}{i}.")
    else:
        yield prefix[:-1], node


def resolved(cfg: DictConfig) -> DictConfig:
    """``cfg`` with every interpolation resolved, as plain data.

    A resolved string that still holds ``${`` (from an environment variable, or an escaped ``\\${`` in an
    override) would be read as a new interpolation here and again by verl's ``OmegaConf.resolve``, which no
    escaping survives: it is refused, naming the key, instead of failing later with a grammar error. So is an
    ``overlay.*`` key that is not ours or a value of the wrong type (`base.overlay_settings`).
    """

    try:
        data = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as e:
        raise ConfigCompositionError(f"config does not resolve: {_one_line(e)}") from None
    for key, value in _leaves(data):
        if isinstance(value, str) and "${" in value:
            shown = repr(value[:80]) + ("..." if len(value) > 80 else "")
            raise ConfigCompositionError(
                f"{key}={shown}: a value that contains '${{' after resolution would be read "
                f"as an OmegaConf interpolation by the trainer; remove the '${{'"
            )
    try:  # every reader of overlay.* reads it typed (`overlay_settings`): a bad key is refused once, here
        overlay_settings(data)
    except OverlaySettingError as e:
        raise ConfigCompositionError(str(e)) from None
    return OmegaConf.create(data)


def _is_group_override(key: str) -> bool:
    """``profile=...``: a config group (a folder of the config search path), not a value."""
    return "." not in key and ((CONFIG_DIR / key).is_dir() or (VERL_CONFIG_DIR / key).is_dir())


def check_integer_overrides(config_name: str, overrides: list[str], cfg: DictConfig) -> None:
    """Refuse, naming the key, a value override that gives a non-integer where the config has an integer.

    OmegaConf keeps ``trainer.nnodes=abc`` as the string 'abc' (the configs are not typed), and the job then
    fails deep inside with a traceback. ``cfg`` is the composition of ``overrides`` (before resolution, so a
    resolver that computes from the key does not fail first); it is compared with the composition of the
    config-group overrides alone (the profile), so only the user's values are judged. A value that is itself
    an interpolation is left to the resolution.
    """
    # lazy: Hydra is heavy and only this path needs it; importing this module stays light
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    groups = [o.input_line for o in parsed if _is_group_override(o.key_or_group)]
    values = {
        o.key_or_group: o.input_line for o in parsed if not _is_group_override(o.key_or_group) and not o.is_delete()
    }
    if not values:
        return
    base = OmegaConf.to_container(compose_config(config_name, groups), resolve=False)
    composed = OmegaConf.to_container(cfg, resolve=False)
    missing = object()
    for key, default in _leaves(base):
        if not isinstance(default, int) or isinstance(default, bool):
            continue
        value: Any = composed
        for part in key.split("."):
            if isinstance(value, dict) and part in value:
                value = value[part]
            elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
                value = value[int(part)]
            else:
                value = missing
                break
        if value is missing:
            continue
        if value is None or (isinstance(value, int) and not isinstance(value, bool)):
            continue
        if isinstance(value, str) and "${" in value:
            continue
        origin = next((line for k, line in values.items() if key == k or key.startswith(k + ".")), None)
        raise ConfigCompositionError(
            f"{key}={repr(value)[:80]}: expected an integer (the {config_name} config has "
            f"{default})" + (f"; from the override {origin!r}" if origin else "")
        )
