"""The unit of a preflight report: one check's outcome and the key or setting that changes it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path

from omegaconf import DictConfig

from verl_patches.base.job_layout import JobLayout, JobLayoutError, job_layout
from verl_patches.base.overlay_settings import OverlaySettings, overlay_settings
from verl_patches.checkpoint.root_access import cluster_run
from verl_patches.driver.config_checks import get  # noqa: F401  (re-exported for the preflight modules)
from verl_patches.launch.settings import ClusterSettings

OK, FAIL, WARN, NOT_CHECKED = "ok", "fail", "warn", "not-checked-here"
STATUSES = (OK, FAIL, WARN, NOT_CHECKED)


@dataclass(frozen=True)
class Finding:
    check: str  # stable id, e.g. "layout.world_size"
    status: str  # one of STATUSES
    message: str
    key: str = ""  # config key(s) and/or setting name(s) to change; "" when nothing to change

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"finding {self.check}: unknown status {self.status!r}")

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class HostFacts:
    """What the preflight knows about the machine it runs on (probed, or given by a test)."""

    device: str  # npu | cuda | cpu
    interfaces: tuple[str, ...] = ()
    npu_count: int = 0
    torch_npu_importable: bool = False
    local_addresses: tuple[str, ...] = ()

    @property
    def is_npu(self) -> bool:
        return self.device == "npu"


@dataclass(frozen=True)
class Context:
    """Everything a check reads. ``cfg`` is resolved (no interpolations left)."""

    cfg: DictConfig
    settings: ClusterSettings
    root: Path
    host: HostFacts

    @property
    def cluster_profile(self) -> bool:
        """The config targets an NPU cluster (an A3 profile), whatever this host is: `cluster_run`, the
        rule the trainer's save, resume and checkpoint-folder check apply too."""
        return cluster_run(self.cfg)

    @property
    def authoritative(self) -> bool:
        """This host is where the job runs, so a missing path or NIC here is a real failure."""
        return self.host.is_npu or not self.cluster_profile

    @property
    def megatron(self) -> bool:
        return get(self.cfg, "actor_rollout_ref.actor.strategy") == "megatron"

    @cached_property
    def layout(self) -> JobLayout | None:
        """The job's layout (`base.job_layout`); None where the config's is refused: the layout.* findings name
        the key, and a check that needs the layout says it was skipped."""
        try:
            return job_layout(self.cfg)
        except JobLayoutError:
            return None

    @cached_property
    def overlay(self) -> OverlaySettings:
        """The ``overlay.*`` settings, typed (the composition refused a bad one already: `config_compose.resolved`)."""
        return overlay_settings(self.cfg)
