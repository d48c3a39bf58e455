"""The runs known by name: one table, `PROFILES`, that the launcher (`launch/job.py`) and the dry run
(`launch/preflight/report.py`) both read.

A profile is a config of `config/` and, for the A3 runs, its ``profile=NAME`` group (``config/profile/NAME.yaml``)
applied on top. The A3 profiles run on a cluster (the launcher's ``--profile``, the cluster settings); ``tiny`` is
the local CPU proof, which the launcher runs with ``--tiny`` (`TINY_CONFIGS`: one config per training engine).
"""

from __future__ import annotations

from dataclasses import dataclass

A3_CONFIG = "ppo_mindspeed_trainer"
TINY_CONFIG = "ppo_tiny_local"  # the A3 path: Megatron/MindSpeed actor+ref, vLLM-Ascend rollout seam, weight sync
TINY_CONFIGS = {"megatron": TINY_CONFIG, "fsdp": "ppo_tiny_local_fsdp"}  # the launcher's --tiny-engine


@dataclass(frozen=True)
class Profile:
    name: str
    config_name: str  # a config of verl_patches/trainer/config
    group: str | None  # the ``profile=`` group applied on top of it; None: the config alone
    cluster: bool  # an A3 cluster run (the launcher's --profile); False: the local tiny run
    needs_checkpoint: bool  # loads the converted weights: the cluster launch requires DIST_CKPT_PATH

    @property
    def overrides(self) -> tuple[str, ...]:
        """The Hydra overrides that select this profile, before the user's."""
        return () if self.group is None else (f"profile={self.group}",)


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile("a3_256die_true_weight", A3_CONFIG, "a3_256die_true_weight", cluster=True, needs_checkpoint=True),
        Profile("a3_256die_random_init", A3_CONFIG, "a3_256die_random_init", cluster=True, needs_checkpoint=False),
        Profile("a3_16die_smoke", A3_CONFIG, "a3_16die_smoke", cluster=True, needs_checkpoint=False),
        Profile("tiny", TINY_CONFIG, None, cluster=False, needs_checkpoint=False),
    )
}
CLUSTER_PROFILES: tuple[str, ...] = tuple(name for name, p in PROFILES.items() if p.cluster)
