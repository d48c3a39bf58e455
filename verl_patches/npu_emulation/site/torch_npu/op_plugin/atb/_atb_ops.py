"""ATB extension registration, called once by vllm-ascend's NPUWorker; nothing to register on a CPU host."""


def _register_atb_extensions() -> None:
    return None
