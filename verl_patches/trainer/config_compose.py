"""Compose our trainer configs on top of verl's own, through Hydra, without touching verl's tree."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = Path(__file__).resolve().parent / "config"
VERL_CONFIG_DIR = REPO_ROOT / "verl" / "trainer" / "config"
CONFIG_NAMES = ("ppo_mindspeed_trainer", "ppo_tiny_local", "ppo_tiny_local_fsdp")


class ConfigCompositionError(ValueError):
    """An override or a profile that does not compose; the message is Hydra's, naming the key."""


def register_resolvers() -> None:
    """${overlay_root:} is the repo root (absolute, so Ray workers resolve paths the same way anywhere);
    ${overlay_device:} is npu/cuda/cpu as the device layer sees this host."""

    def _device() -> str:
        from verl_patches.device import device_kind

        return device_kind()

    OmegaConf.register_new_resolver("overlay_root", lambda: str(REPO_ROOT), replace=True)
    OmegaConf.register_new_resolver("overlay_device", _device, replace=True)


def compose_config(config_name: str = "ppo_mindspeed_trainer", overrides: list[str] | None = None) -> DictConfig:
    """The composed config, interpolations left in place (verl resolves them in its TaskRunner)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    if not VERL_CONFIG_DIR.is_dir():
        raise ConfigCompositionError(f"{VERL_CONFIG_DIR} is missing: run `bash setup_sources.sh` first")
    register_resolvers()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            return compose(config_name=config_name,
                           overrides=[f"hydra.searchpath=[file://{VERL_CONFIG_DIR}]", *(overrides or [])])
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigCompositionError(f"config {config_name!r}: {e}") from None
    finally:
        GlobalHydra.instance().clear()


def resolved(cfg: DictConfig) -> DictConfig:
    out = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    return out
