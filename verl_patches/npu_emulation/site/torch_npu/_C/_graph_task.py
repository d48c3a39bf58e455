"""torch_npu._C._NPUTaskGroupHandle (ACL graph task groups), named by vllm-ascend's type hints."""


class _NPUTaskGroupHandle:
    pass
