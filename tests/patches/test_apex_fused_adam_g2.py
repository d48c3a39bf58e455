"""G2: on NPU, Megatron's `from apex.optimizers import FusedAdam` yields MindSpeed's fused AdamW.

Fakes stand in for `mindspeed.optimizer.adamw` (it needs torch_npu) and for apex; the device is forced
to npu in fresh interpreters.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.patching.patching_testlib import run_json

NPU = {"VERL_PATCHES_DEVICE": "npu", "VERL_PATCHES_QUIET": "1"}

FAKE_MINDSPEED = r"""
import sys, types
def install_fake_mindspeed_adamw():
    mod = types.ModuleType("mindspeed.optimizer.adamw")
    class AdamW:  # MindSpeed's fused NPU AdamW, faked
        pass
    mod.AdamW = AdamW
    sys.modules["mindspeed.optimizer.adamw"] = mod
    return AdamW
"""

APEX_ABSENT = (
    FAKE_MINDSPEED
    + r"""
import json, importlib.util
out = {"apex_installed": importlib.util.find_spec("apex") is not None}
import verl_patches.prelude_patch                       # before the fake exists: activation must stay lazy
from verl_patches.patching.registry import get_registry
st = {m["name"]: m for m in get_registry().manifest()}
out["alias"] = st["apex.optimizers.module_for_npu"]["status"]
out["attr"] = [st["apex.optimizers.FusedAdam_is_mindspeed_adamw"]["status"],
               st["apex.optimizers.FusedAdam_is_mindspeed_adamw"]["detail"]]
out["mindspeed_imported_by_activation"] = any(m.startswith("mindspeed") for m in sys.modules)
AdamW = install_fake_mindspeed_adamw()
from apex.optimizers import FusedAdam, FusedSGD
import torch
out["fused_adam_is_adamw"] = FusedAdam is AdamW
out["fused_sgd_is_torch_sgd"] = FusedSGD is torch.optim.SGD
import megatron.core.optimizer as mco                   # imported after: binds its Adam to the AdamW
out["megatron_adam_is_adamw"] = mco.Adam is AdamW
out["megatron_sgd"] = mco.SGD is torch.optim.SGD
print(json.dumps(out))
"""
)


@pytest.mark.slow
def test_apex_absent_fused_adam_is_mindspeed_adamw_and_megatron_binds_it():
    out, _ = run_json(APEX_ABSENT, env=NPU)
    if out["apex_installed"]:
        pytest.skip("apex is installed here; the absent-apex path cannot be exercised")
    assert out["alias"] == "applied"
    assert out["attr"][0] == "not-needed" and "our stand-in" in out["attr"][1]
    assert not out["mindspeed_imported_by_activation"], "the prelude must not import MindSpeed (torch_npu) itself"
    assert out["fused_adam_is_adamw"] and out["fused_sgd_is_torch_sgd"]
    assert out["megatron_adam_is_adamw"] and out["megatron_sgd"]


NO_MINDSPEED_DEPS = r"""
import json, sys
import verl_patches.prelude_patch                       # must not fail on a host where MindSpeed cannot import
out = {"ok": True}
try:
    from apex.optimizers import FusedAdam
    out["fused_adam"] = repr(FusedAdam)
except ImportError as e:                                 # Megatron catches this and falls back to torch AdamW
    out["fused_adam_error"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


def test_npu_prelude_survives_a_host_without_torch_npu():
    out, _ = run_json(NO_MINDSPEED_DEPS, env=NPU)
    assert out["ok"]
    assert "fused_adam_error" in out, out
    assert "torch_npu" in out["fused_adam_error"] or "mindspeed" in out["fused_adam_error"]


APEX_PRESENT = (
    FAKE_MINDSPEED
    + r"""
import json, os
AdamW = install_fake_mindspeed_adamw()
preimport = os.environ["PREIMPORT"] == "1"
if preimport:
    import apex.optimizers
import verl_patches.prelude_patch
from verl_patches.patching.registry import get_registry
reg = get_registry()
before = {m["name"]: m["status"] for m in reg.manifest()}
import apex.optimizers as ao
from apex.optimizers import FusedAdam, FusedSGD
after = {m["name"]: m["status"] for m in reg.manifest()}
out = {"before": before, "after": after,
       "fake_module_kept": ao.__file__.endswith(os.path.join("apex", "optimizers.py")),
       "fused_adam_is_adamw": FusedAdam is AdamW, "fused_sgd_is_fake": FusedSGD.__name__ == "FakeApexFusedSGD"}
if not preimport:
    import megatron.core.optimizer as mco
    out["megatron_adam_is_adamw"] = mco.Adam is AdamW
print(json.dumps(out))
"""
)


@pytest.fixture
def fake_apex(tmp_path):
    root = tmp_path / "site"
    (root / "apex").mkdir(parents=True)
    (root / "apex" / "__init__.py").write_text("")
    (root / "apex" / "optimizers.py").write_text(
        textwrap.dedent("""
        class FusedAdam:  # apex's CUDA fused Adam, faked
            pass

        class FakeApexFusedSGD:
            pass

        FusedSGD = FakeApexFusedSGD
    """)
    )
    return root


@pytest.mark.slow
@pytest.mark.parametrize("preimport", ["0", "1"])
def test_installed_apex_gets_fused_adam_replaced(fake_apex, preimport):
    out, _ = run_json(APEX_PRESENT, env={**NPU, "PREIMPORT": preimport}, pythonpath=(fake_apex,))
    alias, attr = "apex.optimizers.module_for_npu", "apex.optimizers.FusedAdam_is_mindspeed_adamw"
    assert out["before"][alias] == "not-needed"
    assert out["before"][attr] == ("applied" if preimport == "1" else "pending")
    assert out["after"][attr] == "applied"
    assert out["fake_module_kept"] and out["fused_sgd_is_fake"]
    assert out["fused_adam_is_adamw"]
    if preimport == "0":
        assert out["megatron_adam_is_adamw"]
