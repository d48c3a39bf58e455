"""A role folder of a committed step, read back: only the files its step manifest lists, each checked.

Every reader of a saved role (the Megatron actor's load, the FSDP path's checks, the tests) opens it through
`CommittedRole`: a name is confined to the role folder, a file the manifest does not list is refused by name,
and a file is loaded with `safe_load.load_tensor_file` against its recorded sha256. `saved_layout` is the
training layout the role was saved at, as its rank records and the step manifest agree on it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_patches.checkpoint.commit import read_manifest, read_rank_records
from verl_patches.checkpoint.confine import ConfinementError, confined_path, is_real_dir
from verl_patches.checkpoint.manifest import CheckpointIncomplete, FileRecord, RankRecord, TrainLayout
from verl_patches.checkpoint.safe_load import load_tensor_file


@dataclass(frozen=True)
class CommittedRole:
    """A role folder of a committed step: where it is, the step, and its files as the step manifest records them."""

    role: Path
    step: int
    files: Mapping[str, FileRecord]
    layout: TrainLayout | None

    @classmethod
    def open(cls, role_dir: str | os.PathLike[str]) -> CommittedRole:
        """The role folder ``role_dir`` of a committed step (``<step>/checkpoint.json`` lists its files);
        CheckpointIncomplete, one line naming the file, for a link, an uncommitted or damaged folder."""
        role = Path(role_dir)
        manifest = read_manifest(role.parent)  # refuses a linked step folder, checks the manifest strictly
        if role.name not in manifest.roles or not is_real_dir(role):
            raise CheckpointIncomplete(
                f"{role}: not a role folder of the committed step {role.parent} (a real folder "
                "listed in its checkpoint.json)"
            )
        return cls(
            role=role, step=manifest.step, files=manifest.role_files(role.name), layout=manifest.roles[role.name]
        )

    def path(self, rel: str) -> tuple[Path, str]:
        """(the file's path inside the role folder, its recorded sha256); a file the manifest does not list,
        or one reached through a link, is refused by name."""
        where = str(self.role.parent / "checkpoint.json")
        try:
            path = confined_path(self.role, rel, where)
        except ConfinementError as err:
            raise CheckpointIncomplete(str(err)) from None
        rec = self.files.get(rel)
        if rec is None:
            raise CheckpointIncomplete(f"{path}: not listed in {where}; only files of the committed save are read")
        return path, rec.sha256

    def load(self, rel: str) -> Any:
        path, sha = self.path(rel)
        return load_tensor_file(path, expected_sha256=sha)


def saved_layout(committed: CommittedRole) -> tuple[TrainLayout, list[RankRecord]]:
    records = read_rank_records(committed.role, committed.files)  # exactly the records the manifest lists
    if not records or committed.layout is None:
        raise CheckpointIncomplete(f"{committed.role}: no rank records; not a checkpoint written by verl_patches")
    if any(r.layout != committed.layout for r in records):
        raise CheckpointIncomplete(
            f"{committed.role}: rank records disagree with the layout in {committed.role.parent / 'checkpoint.json'}"
        )
    return committed.layout, records
