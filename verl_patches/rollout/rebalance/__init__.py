"""F5 rollout rebalance: move running sequences off the DP ranks that keep a large decode batch so every
rank can drop to a smaller pre-compiled graph batch size (vendor: 6200 s -> ~2300 s for 32K responses).

Here: `planner` (which requests move where; pure), `hooks` (before/after wrappers on engine methods),
`metadata` (pickled request metadata exchanged with two all_to_all_single calls), `recover` (migrated
outputs returned to their source rank and regrouped under the parent request). Tested on CPU.
A3-only and NOT implemented here: moving a running request's KV blocks and scheduler state between
engines (needs vLLM's scheduler, block tables and NPU KV tensors); `ROLLOUT_REBALANCE_ENABLE` stays off.
"""
