"""torch.npu.config: runtime switches vllm-ascend sets at import (allow_internal_format); plain attributes
on a CPU host, where tensors have no internal (NZ) format."""

allow_internal_format = False
