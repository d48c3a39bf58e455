"""Environment facts MindSpeed asks for."""

EMULATED_CANN_VERSION = "8.2.RC1"  # what the A3 profile pins; MindSpeed compares versions, never calls CANN here


def get_cann_version() -> str:
    return EMULATED_CANN_VERSION
