"""CPU stand-in for pyACL (`acl`): device queries answer for the emulated A3; runtime calls are not
available on a CPU host."""

from acl import rt  # noqa: F401

A3_SOC_NAME = "Ascend910_9391"


def get_soc_name() -> str:
    return A3_SOC_NAME
