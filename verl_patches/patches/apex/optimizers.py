"""`apex.optimizers` for Ascend: FusedAdam is MindSpeed's fused NPU AdamW (vendor item G2).

Megatron core 0.8 does `from apex.optimizers import FusedAdam as Adam, FusedSGD as SGD` and falls
back to torch's unfused AdamW when that fails. Attributes resolve on first use so that importing this
module never imports MindSpeed (and through it torch_npu) by itself.
"""

from __future__ import annotations

from typing import Any


def fused_adam_class() -> type:
    # deferred: a patch applies while upstream is still importing; MindSpeed is read at call time
    from mindspeed.optimizer.adamw import AdamW

    return AdamW


def __getattr__(name: str) -> Any:
    if name == "FusedAdam":
        return fused_adam_class()
    if name == "FusedSGD":  # MindSpeed has no fused SGD; Megatron imports the name together with FusedAdam
        # lazy: torch is heavy and only this path needs it; importing this module stays light
        import torch

        return torch.optim.SGD
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
