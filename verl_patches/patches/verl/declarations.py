"""Patches of top-level verl modules (verl.protocol)."""

from verl_patches.patching.declaration import ALL_DEVICES, replace, wrap

PATCHES = [
    replace(
        name="protocol.union_locked_tensor_dict",
        target="verl.protocol:union_tensor_dict",
        fingerprint="sha256:5b4b6f8f12e7a426",
        by="verl_patches.patches.verl.protocol:union_tensor_dict",
        vendor_item="C7",
        reason="D2D unions a tensor-less (locked) DataProto with cached tensors; unlock for the inserts, "
        "lock again after",
        devices=ALL_DEVICES,
    ),
    wrap(
        name="protocol.pickle_empty_batch",
        target="verl.protocol:DataProto.__getstate__",
        fingerprint="sha256:6710d7a87f5dbe6d",
        by="verl_patches.patches.verl.protocol:pickle_empty_batch",
        vendor_item="A2",
        reason="with D2D, ref's payload and answer are batches with a size and no tensor; upstream's pickling "
        "consolidates the TensorDict first, which fails without tensors, so Ray could not ship them",
        devices=ALL_DEVICES,
    ),
]
