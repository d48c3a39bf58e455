"""The CPU proof's pins (verl_patches/base/cpu_numerics.py) give the same floats on every x86-64 host.

A fixed set of GEMMs (MKL), vectorised ops (ATen) and reductions, from seeded inputs (torch's CPU generator is the
same on every host), computed in a fresh interpreter under the pins; the digest of their bits must equal the one
recorded on the baseline's host. A host that computes other floats fails here, naming the pins, before the
tiny run's golden check fails for a reason nobody can see. Measured when recorded (2026-11-28, AMD EPYC Zen 5 with
AVX-512): the digest changes with MKL's branch (COMPATIBLE vs AUTO) and ATen's (AVX2 vs AVX-512), while MKL's
named ISA branches (AVX2, AVX512, SSE4_2) all ran AUTO on that non-Intel processor (the second test).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from verl_patches.base import cpu_numerics

PROBE = r"""
import hashlib, torch
torch.manual_seed(0)
h = hashlib.sha256()
def add(t): h.update(t.contiguous().numpy().tobytes())
for (m, k, n) in [(7, 33, 17), (64, 64, 64), (50, 64, 128), (256, 96, 88), (3, 1024, 5)]:
    a, b = torch.randn(m, k), torch.randn(k, n)
    add(a @ b); add(torch.nn.functional.linear(a, b.t(), torch.randn(n)))
x = torch.randn(37, 129)
for f in (torch.exp, torch.tanh, torch.sigmoid, torch.rsqrt, torch.nn.functional.silu, torch.log1p):
    add(f(x.abs() if f in (torch.rsqrt, torch.log1p) else x))
add(torch.softmax(x, -1)); add(torch.log_softmax(x, -1)); add(x.sum(-1)); add(x.pow(2).mean(-1))
add(torch.bmm(torch.randn(4, 9, 31), torch.randn(4, 31, 6)))
print(h.hexdigest()[:16])
"""
RECORDED = "4c10413f180f87a9"  # the pins' digest on the baseline's host (torch 2.5.1)


def _digest(**overrides: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k not in cpu_numerics.PINS}
    env.update(cpu_numerics.PINS)
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


x86 = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the pins are x86-64 code paths")


@x86
def test_the_pins_compute_the_recorded_floats() -> None:
    pins = " ".join(f"{k}={v}" for k, v in cpu_numerics.PINS.items())
    assert _digest() == RECORDED, (
        f"this host computes other floats than the golden baseline's host under {pins}: the tiny run's golden "
        "check may fail here for no fault of the code (see verl_patches/base/cpu_numerics.py)"
    )


@x86
def test_each_kernel_pin_changes_the_floats() -> None:
    """The probe sees the pins at all: MKL's COMPATIBLE branch and ATen's AVX2 kernels each change its bits
    against the host's default dispatch (on an AVX2-only host ATen's default is AVX2: skipped there)."""
    pinned = _digest()
    assert _digest(MKL_CBWR="AUTO") != pinned
    default_aten = _digest(ATEN_CPU_CAPABILITY=None)
    if default_aten == pinned:
        pytest.skip("ATen's default kernels on this host are its AVX2 ones")
    assert default_aten != pinned
