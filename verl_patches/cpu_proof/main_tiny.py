"""The CPU proof's entry: ``python -m verl_patches.cpu_proof.main_tiny [--config-name NAME] [key=value ...]``.

The trainer entry (`verl_patches.trainer.main_ppo_npu`) with the tiny profile's local assets built first
(`tiny_a3.prepare_for`: data, tokenizer, model, and on the A3 path the Megatron checkpoint), from the composed
config and before anything starts. The launcher's ``--tiny`` starts it; the trainer entry itself never imports the
CPU proof.
"""

from __future__ import annotations

import sys

from verl_patches.cpu_proof.tiny_a3 import prepare_for
from verl_patches.trainer import main_ppo_npu


def main(argv: list[str] | None = None) -> int:
    return main_ppo_npu.main(argv, prepare=prepare_for)


if __name__ == "__main__":
    sys.exit(main())
