"""SoC identification: the emulation reports an Atlas A3 (SoC versions 250-255), which is what the code
paths under test are written for."""

A3_SOC_VERSION = 250  # Ascend910_9391; vllm-ascend treats 250-255 as A3
A3_SOC_NAME = "Ascend910_9391"


def get_soc_version() -> int:
    return A3_SOC_VERSION
