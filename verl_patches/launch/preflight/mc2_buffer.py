"""What MC2 (vllm-ascend's MoE dispatch/combine on A3) needs of HCCL_BUFFSIZE, and the rows it receives.

Pure integer arithmetic on the sizes vllm-ascend 0.9.1 passes to `torch_npu.npu_moe_distribute_dispatch(_v2)`
(`fused_experts_with_mc2`, vllm_ascend/ops/fused_moe.py:131-205): per rank `BS` tokens (the DP rank's padded
tokens split over its TP ranks, fused_moe.py:1371-1396), `global_bs = BS x ep_world_size`, `tp_world_size=1`
(no TP domain, so the documented TP-domain rule does not apply), `shared_expert_rank_num=0` and
`shared_expert_num` left at its default 1, no quantisation.

The formulas are not in the torch_npu 2.5.1.post1 wheel (its `_op_plugin_docs.py` has no entry for either
dispatch op); they are the documented constraints "HCCL_BUFFSIZE" of the ops' reference pages, Atlas A3:
  * dispatch (v1): Ascend/op-plugin docs/context/torch_npu-npu_moe_distribute_dispatch.md, section 约束说明,
    the revision that names Ascend Extension for PyTorch 7.1.0: HCCL_BUFFSIZE >= 2 and
    ``1024^2 * (HCCL_BUFFSIZE - 2) / 2 >= BS * 2 * (H + 128) * (ep_world_size * local_expert_num + K + 1)``;
  * dispatch_v2, comm_alg "" (what vllm-ascend passes): Ascend/op-plugin
    docs/context/torch_npu-npu_moe_distribute_dispatch_v2.md, section 约束说明 (the same rule as CANN's
    aclnnMoeDistributeDispatchV2.md, 约束说明 6): HCCL_BUFFSIZE >= 2 and, in bytes,
    ``HCCL_BUFFSIZE MB >= 2 * (local_expert_num * max_bs * ep_world_size * Align512(Align32(2 * H) + 64)
    + (K + shared_expert_num) * max_bs * Align512(2 * H))``.
"/" is integer division there; HCCL_BUFFSIZE is in MB (2**20 bytes) per communicator. vllm-ascend calls v2
when the wheel has it (`hasattr(torch_npu, "npu_moe_distribute_dispatch_v2")`, fused_moe.py:168; the real
2.5.1.post1 wheel registers it) and v1 otherwise; the v2 page at hand is a later revision than the wheel, so
the requirement is the larger of the two rules: a setting that meets it meets the rule of either op.
"""

from __future__ import annotations

from dataclasses import dataclass

MB = 2**20  # HCCL_BUFFSIZE's unit
MIN_BUFFSIZE_MB = 2  # both rules: HCCL_BUFFSIZE >= 2
A3_MAX_BS = 512  # both pages, Atlas A3: 0 < BS <= 512


def align(x: int, to: int) -> int:
    """``((x + to - 1) / to) * to`` with integer division: the pages' Align32 / Align512."""
    return (x + to - 1) // to * to


@dataclass(frozen=True)
class Mc2Sizes:
    """The dispatch arguments that size MC2's window, as vllm-ascend passes them on one rank."""

    bs: int  # tokens this rank dispatches (max over the EP group: vllm-ascend pads every rank to it)
    hidden: int  # H
    top_k: int  # K
    ep_world_size: int
    local_expert_num: int  # routed experts on one MoE expert rank
    shared_expert_num: int = 1  # vllm-ascend leaves the op's default

    def __post_init__(self) -> None:
        for name in ("bs", "hidden", "top_k", "ep_world_size", "local_expert_num"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"MC2 size {name}={value!r} must be a positive integer")
        if isinstance(self.shared_expert_num, bool) or not isinstance(self.shared_expert_num, int):
            raise ValueError(f"MC2 size shared_expert_num={self.shared_expert_num!r} must be an integer")
        if self.shared_expert_num < 0:
            raise ValueError(f"MC2 size shared_expert_num={self.shared_expert_num} must be >= 0")

    @property
    def receive_rows(self) -> int:
        """A: the rows of `expand_x` one expert rank receives, as the wheel's Meta function of
        npu_moe_distribute_dispatch_v2 sizes it (op_plugin/meta/_meta_registrations.py:
        ``global_bs * min(local_moe_expert_num, k)``, global_bs = BS x ep_world_size); a TorchAir graph is
        static, so its MoE intermediates have A rows whatever the routing."""
        return self.bs * self.ep_world_size * min(self.local_expert_num, self.top_k)

    def describe(self) -> str:
        return (
            f"BS {self.bs} tokens per rank, H {self.hidden}, top-k {self.top_k}, EP {self.ep_world_size}, "
            f"{self.local_expert_num} expert(s) per rank, shared_expert_num {self.shared_expert_num}"
        )


def dispatch_v1_buffsize_mb(s: Mc2Sizes) -> int:
    """The least HCCL_BUFFSIZE (MB) npu_moe_distribute_dispatch's A3 rule admits."""
    need = s.bs * 2 * (s.hidden + 128) * (s.ep_world_size * s.local_expert_num + s.top_k + 1)
    half_mb = MB // 2  # 1024^2 * (B - 2) / 2 >= need  <=>  (B - 2) * 2^19 >= need (1024^2 * n is even)
    return MIN_BUFFSIZE_MB + -(-need // half_mb)


def dispatch_v2_bytes(s: Mc2Sizes) -> int:
    """The bytes npu_moe_distribute_dispatch_v2's A3 rule asks of the window (comm_alg "")."""
    token_in = align(align(2 * s.hidden, 32) + 64, 512)
    token_out = align(2 * s.hidden, 512)
    return 2 * (
        s.local_expert_num * s.bs * s.ep_world_size * token_in + (s.top_k + s.shared_expert_num) * s.bs * token_out
    )


def dispatch_v2_buffsize_mb(s: Mc2Sizes) -> int:
    """The least HCCL_BUFFSIZE (MB) npu_moe_distribute_dispatch_v2's A3 rule admits."""
    return max(MIN_BUFFSIZE_MB, -(-dispatch_v2_bytes(s) // MB))


def required_buffsize_mb(s: Mc2Sizes) -> tuple[int, str]:
    """The least HCCL_BUFFSIZE (MB) both documented rules admit, and which rule sets it."""
    v1, v2 = dispatch_v1_buffsize_mb(s), dispatch_v2_buffsize_mb(s)
    if v2 >= v1:
        return v2, f"npu_moe_distribute_dispatch_v2's rule ({v2} MB; dispatch v1's: {v1} MB)"
    return v1, f"npu_moe_distribute_dispatch's rule ({v1} MB; dispatch_v2's: {v2} MB)"
