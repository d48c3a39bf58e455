"""Plain-torch versions of the torch_npu / MindSpeed fused operations the A3 profile calls.

Each function has the signature and return convention of the NPU op it stands in for and computes
the op's reference formula with ordinary differentiable torch operations (autograd gives the
backward). `verl_patches.npu_emulation.catalog` lists them with their formulas.
"""
