"""The emulation held to the pinned torch_npu wheel's contract (one module per job):

* `pin`: the wheel's file name, sha256 and PyPI address (its one home); `fetch`: into the wheel cache, checked;
* `archive`: its members read from the zip; `schemas`, `sandbox`, `exposure`: the registered schemas, the Meta
  functions (captured, not registered) and torch_npu's attribute set, read from it; `contract`: all of it, once
  per process;
* `registration`, `python_ops`: the emulated ops defined with the wheel's schemas and Meta functions;
  `deviations`: the declared departures (one schema's alias marks, one Meta function's known wrong shapes);
* `limits`, `cpu_proof`: the documented limits every rollout kernel enforces, and the CPU proof's two declared
  exceptions to them;
* `probes`: the ``hasattr(torch_npu, ...)`` probes of upstream code, which the emulation must answer as the wheel;
* `summary`: what the audit reports (without torch).
"""
