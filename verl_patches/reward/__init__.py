"""Strict, equivalence-aware, time-bounded math reward for deepscaler-style data (vendor item H).

- `extract`: which part of a response is graded, under the format rule (`strict`, R1-Zero's: after
  the last `</think>`, its last box; `relaxed`: also responses without think tags and marked answers).
- `normalize`: canonical strings and the fast exact/numeric comparison, built from `unicode_math`
  (unicode to LaTeX), `units` (trailing units, compound ones included), `solutions` (assignments,
  solution lists, equations) and `numbers` (exact values, written precision, repeating decimals,
  number words).
- `limits`: cheap tractability checks that keep adversarial answers away from sympy.
- `symbolic`: math-verify based equivalence, run only inside guarded worker processes.
- `guarded_pool`: worker processes with hard per-item deadlines, usable from any thread.
- `deepscaler`: `compute_score` (one response) and `compute_score_batch` (a training step).
- `entry`: the file verl loads as `custom_reward_function.path`; routes "deepscaler" here and every
  other data source to verl's own `default_compute_score`.

Importing this package has no side effects.
"""
