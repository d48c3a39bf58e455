"""The CPU proof's floating-point results, pinned to one code path on every x86-64 host.

The tiny run is compared with a baseline recorded on another machine (the golden check), and its 100-step base
model is trained from scratch on the host that runs it. PyTorch picks its CPU kernels by what the processor
offers (ATen's vectorised kernels: AVX2 or AVX-512; MKL's GEMM: AVX2, AVX-512 or AMX; oneDNN likewise), and
their sums round differently: on 2026-11-26 the same code gave a base model validating at 0.52 on an
AVX-512/AMX host where the baseline's host gave 0.72. ATen is held to its AVX2 kernels and oneDNN to AVX2. MKL is
held to its COMPATIBLE branch (SSE2 without the approximate reciprocals), the one branch MKL documents as giving
the same results on Intel and non-Intel processors: a named ISA branch (MKL_CBWR=AVX2) holds only on Intel, and
MKL runs its AUTO branch on any other vendor's processor. Measured 2026-11-28 on an AMD EPYC (Zen 5, AVX-512):
MKL_CBWR=AVX2, AVX512, SSE4_2 and AUTO gave bit-identical GEMMs (the setting was ignored) while COMPATIBLE
changed them, and README command 1 under the AVX2 pin trained to a reward 0.10 below the baseline recorded on
an Intel host in its first ten steps (it passed the golden check by 0.0011). COMPATIBLE's GEMM is slower (2.3x
on that host for the tiny model's shapes); the tiny run's time is dominated by other work (README gives it).
tests/base/test_cpu_numerics.py computes a fixed set of GEMMs and vectorised ops under these pins and compares
their bits with the ones recorded here, so a host that computes other floats fails there, by name, before a
golden check fails for a reason nobody can see.
The number of intra-op threads splits reductions differently too (measured: the tiny run's first three steps
with 2 threads and with 1 differ from the first step's log-probs on, around 1e-7), and a host's core count sets
it; one thread per process also keeps the tiny run's four workers and its task runner from oversubscribing a
small host (measured on 2 cores: the first rollout 22.7 s with the default 2 threads per process, 4.7 s with 1;
later steps 5 % faster). Set by the launcher for the tiny run only (`run_tiny`), unless the user set them (the
test suite sets the two thread variables the same way, tests/conftest.py); recorded in the tiny assets' stamp,
so assets built under other settings are rebuilt.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

PINS = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "COMPATIBLE",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


def pinned(environ: Mapping[str, str]) -> dict[str, str]:
    """The pins this environment lacks (an explicit user setting wins)."""
    return {k: v for k, v in PINS.items() if k not in environ}


def current(environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    env = os.environ if environ is None else environ
    return {k: env.get(k) for k in PINS}
