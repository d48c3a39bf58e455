"""acl.rt on a CPU host: only what imports need; calls that would touch a device raise."""


def get_device_count() -> tuple[int, int]:
    return 1, 0


def memcpy(*args, **kwargs):
    raise RuntimeError("acl.rt.memcpy: no Ascend runtime on a CPU host")
