#!/usr/bin/env python3
"""Check, before booking a cluster, that a converted checkpoint and the engines agree with Hugging Face.

  # a slice of the real checkpoint on one CPU host: 3 dense layers + 1 MoE layer, 16 experts
  python verl_patches/scripts/check_logprobs.py --hf /data/DeepSeek-V3-bf16 --mcore /data/dsv3-mcore \\
      --layers 4 --experts 16 --tp 1 --pp 1 --ep 2

Prints max and mean |log-prob difference| per engine (megatron, rollout) against HF transformers. Exit status:
0 every engine within --tolerance; 1 a mismatch, naming the engine and the worst token position; 2 bad input
(flags, model folder, tokenizer, tensors, checkpoint) or any failure on the way, one line.
See `python verl_patches/scripts/check_logprobs.py --help` and `verl_patches/checks`.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: make the repo importable

from verl_patches.base.tool_python import third_party_imports  # noqa: E402

with third_party_imports("check_logprobs.py"):  # another Python than requirements.txt's: one line, exit 2
    from verl_patches.checks.cli import main

if __name__ == "__main__":
    sys.exit(main())
