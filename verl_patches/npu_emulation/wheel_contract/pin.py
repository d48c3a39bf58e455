"""The pinned torch_npu wheel the emulation is held to: its one home (file name, sha256, where PyPI serves it).

requirements.txt pins torch-npu==2.5.1.post1 for A3 (aarch64); this is the same release's x86_64 CPython 3.11
wheel, which carries the same op schemas, Meta functions and documented limits as plain text and Python, so a
CPU host can read them without CANN. The wheel is fetched into the user's wheel cache, its sha256 checked, and
never installed or imported as a package (`fetch`, `archive`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WheelPin:
    project: str  # as requirements.txt names it
    version: str
    file: str
    sha256: str
    url: str  # PyPI's address of exactly this file (for the audit and a reader who wants to check by hand)
    platform_tags: tuple[str, ...]  # what `pip download --platform` is given to fetch this file on any host
    python_version: str
    abi: str


TORCH_NPU_WHEEL = WheelPin(
    project="torch-npu",
    version="2.5.1.post1",
    file="torch_npu-2.5.1.post1-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    sha256="c0ee549621d905f4006b37d9e815fffa15b10cbda3bcdf364daeeb88cd9d21d2",
    url=(
        "https://files.pythonhosted.org/packages/aa/72/7adf428fc41434a5c04b786c182968b64255a9b400a43f19064b21b3353e/"
        "torch_npu-2.5.1.post1-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
    ),
    platform_tags=("manylinux_2_17_x86_64", "manylinux2014_x86_64"),
    python_version="3.11",
    abi="cp311",
)
