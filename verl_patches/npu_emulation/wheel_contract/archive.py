"""Members of the pinned torch_npu wheel read as bytes or text straight from the zip: nothing is extracted, nothing
lands on an import path, nothing of it is imported as a package."""

from __future__ import annotations

import io
import zipfile

# The wheel's files the contract is read from (paths inside the archive)
NATIVE_FUNCTIONS = "torch_npu/csrc/aten/npu_native_functions.yaml"
NATIVE_FUNCTIONS_CODEGEN = "torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml"
TORCH_NPU_LIBRARY = "torch_npu/lib/libtorch_npu.so"  # its TORCH_LIBRARY(npu) definitions: the registered schemas
ATB_LIBRARY = "torch_npu/lib/libop_plugin_atb.so"  # its TORCH_LIBRARY(atb) definitions
ATB_OPS = "torch_npu/op_plugin/atb/_atb_ops.py"  # which ATB ops torch_npu exposes, and where
META_REGISTRATIONS = "torch_npu/op_plugin/meta/_meta_registrations.py"
ATB_META_REGISTRATIONS = "torch_npu/op_plugin/atb/_atb_meta_registrations.py"
TORCHAIR_CUSTOM_OPS = "torch_npu/dynamo/torchair/_contrib/custom_torch_ops/auto_register_custom_torch_ops.py"
CUSTOM_OPS = "torch_npu/utils/custom_ops.py"  # torch_npu.<name> = torch.ops.npu.<name>, for every exposed op
PACKAGE_INIT = "torch_npu/__init__.py"
OP_PLUGIN_INIT = "torch_npu/op_plugin/__init__.py"
OP_DOCS = "torch_npu/_op_plugin_docs.py"
ATB_DOCS = "torch_npu/op_plugin/atb/_atb_api_docs.py"


class WheelArchive:
    """The wheel's members by name, from its bytes (already checked against the pin); a name the archive does
    not hold is a KeyError naming it."""

    def __init__(self, data: bytes, name: str) -> None:
        self.name = name
        self._zip = zipfile.ZipFile(io.BytesIO(data))
        self._names = frozenset(self._zip.namelist())

    def data(self, member: str) -> bytes:
        if member not in self._names:
            raise KeyError(f"{self.name}: no member {member}")
        return self._zip.read(member)

    def text(self, member: str) -> str:
        return self.data(member).decode("utf-8")
