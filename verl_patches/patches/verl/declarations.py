"""Patches of top-level verl modules (verl.protocol)."""

from verl_patches.patching.declaration import ALL_DEVICES, Kind, Patch, lazy_object

PATCHES = [
    Patch(
        name="protocol.union_locked_tensor_dict",
        target="verl.protocol:union_tensor_dict",
        kind=Kind.REPLACE,
        fingerprint="sha256:5b4b6f8f12e7a426",
        replacement=lazy_object("verl_patches.patches.verl.protocol:union_tensor_dict"),
        vendor_item="C7",
        reason="D2D unions a tensor-less (locked) DataProto with cached tensors; unlock for the inserts, "
               "lock again after",
        devices=ALL_DEVICES,
    ),
]
