"""`StandinLLM`: the part of `vllm.LLM` verl v0.4.0 (and our lifecycle) uses, computed on CPU.

Surface:
  LLM(model=..., tensor_parallel_size, dtype, seed, max_model_len, max_num_seqs, load_format,
      enable_sleep_mode, enable_expert_parallel, ...)           other engine keywords are accepted
  .generate(prompts=[{"prompt_token_ids": [...]}, ...], sampling_params=SamplingParams(...), use_tqdm=False)
      -> list of vLLM RequestOutput (outputs[j].token_ids, .logprobs, .cumulative_logprob, .finish_reason)
  .llm_engine.model_executor.driver_worker.worker.model_runner.model   (StandinDeepseekV3: load_weights)
  .llm_engine.model_executor.driver_worker.worker.model_runner.kv_caches
  .llm_engine.engine_core.engine_core.{kv_cache_configs, model_executor.initialize_from_config(configs)}
  .llm_engine.vllm_config.compilation_config.static_forward_context   (layers with .kv_cache)
  .sleep(level=1) / .wake_up(tags=None)   mapped to the lifecycle (never camem)

The engine core runs F3's `initialize_kv_caches_keeping_configs` with vLLM's own `get_kv_cache_config`
(the same code the patched vLLM runs), so the KV cache is sized and re-created exactly as on A3.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from transformers import AutoConfig

from verl_patches.base import env_registry
from verl_patches.checkpoint import rng
from verl_patches.resilience import progress
from verl_patches.rollout.kv_cache_config import initialize_kv_caches_keeping_configs
from verl_patches.rollout.lifecycle import RolloutLifecycle, is_placeholder
from verl_patches.rollout.standin import cache as kv
from verl_patches.rollout.standin.model import StandinDeepseekV3
from verl_patches.rollout.standin.sampler import sample

_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
}
BLOCK_SIZE = 16
SAMPLING_GENERATOR = "rollout_standin.sampling"  # its name among the RNG states of a checkpoint


class AttentionLayer:
    """A static-forward-context entry: what vLLM's Attention layer exposes to the lifecycle."""

    def __init__(self, name: str) -> None:
        # deferred: importing this module must not load vLLM; it loads once the prelude patched it
        from vllm.attention import AttentionType

        self.layer_name, self.attn_type = name, AttentionType.DECODER
        self.kv_cache: list[torch.Tensor] = [torch.tensor([])]


class StandinModelRunner:
    def __init__(self, model: StandinDeepseekV3, forward_context: dict[str, AttentionLayer]) -> None:
        self.model = model
        self.kv_caches: list[torch.Tensor] = []
        self._context = forward_context


class StandinExecutor:
    """The engine core's view of the (single, in-process) worker."""

    def __init__(self, runner: StandinModelRunner, spec: Any, kv_bytes: int) -> None:
        self.runner, self._spec, self._kv_bytes = runner, spec, kv_bytes
        self.driver_worker = SimpleNamespace(worker=SimpleNamespace(model_runner=runner))

    def get_kv_cache_specs(self) -> list[dict[str, Any]]:
        return [{name: self._spec for name in self.runner._context}]

    def determine_available_memory(self) -> list[int]:
        return [self._kv_bytes]

    def initialize_from_config(self, configs: list[Any]) -> None:
        model = self.runner.model
        first = next(model.parameters())
        tensors = kv.allocate(configs[0], model.config, first.dtype, first.device)
        for name, layer in self.runner._context.items():
            layer.kv_cache = [tensors[name]]
        self.runner.kv_caches = [tensors[name] for name in self.runner._context]


class StandinLLM:
    def __init__(
        self,
        model: str,
        tensor_parallel_size: int = 1,
        dtype: str = "float32",
        seed: int = 0,
        max_model_len: int | None = None,
        max_num_seqs: int = 64,
        load_format: str = "auto",
        enable_expert_parallel: bool = False,
        **engine_kwargs: Any,
    ) -> None:
        if tensor_parallel_size != 1:
            raise ValueError("the CPU rollout stand-in runs at tensor_parallel_size 1")
        self.engine_kwargs = dict(
            engine_kwargs,
            tensor_parallel_size=tensor_parallel_size,
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            load_format=load_format,
            enable_expert_parallel=enable_expert_parallel,
        )
        hf_config = AutoConfig.from_pretrained(model)
        hf_config._attn_implementation = "eager"
        torch_dtype = torch.float32 if dtype in (None, "auto") else _DTYPES.get(str(dtype), torch.float32)
        ep_size, ep_rank = 1, 0
        if enable_expert_parallel:  # vLLM: EP over the DP x TP ranks of the instance
            ep_size = env_registry.integer("VLLM_DP_SIZE") * tensor_parallel_size
            ep_rank = env_registry.integer("VLLM_DP_RANK") * tensor_parallel_size
        _ensure_vllm_parallel_state(tensor_parallel_size)
        self.max_model_len = int(max_model_len or hf_config.max_position_embeddings)
        self.max_num_seqs = int(max_num_seqs)
        self.eos_token_id = hf_config.eos_token_id
        self.pad_token_id = hf_config.pad_token_id if hf_config.pad_token_id is not None else 0
        net = StandinDeepseekV3(hf_config, dtype=torch_dtype, ep_size=ep_size, ep_rank=ep_rank)
        if not str(load_format).startswith("dummy"):
            net.load_weights(_safetensors_weights(Path(model)))
            net.process_weights_after_loading()
        context = {name: AttentionLayer(name) for name in kv.layer_names(hf_config.num_hidden_layers)}
        runner = StandinModelRunner(net, context)
        spec = kv.attention_spec(hf_config, BLOCK_SIZE, torch_dtype)
        slot_blocks = -(-self.max_model_len // BLOCK_SIZE)
        kv_bytes = self.max_num_seqs * slot_blocks * spec.page_size_bytes * hf_config.num_hidden_layers
        executor = StandinExecutor(runner, spec, kv_bytes)
        vllm_config = SimpleNamespace(
            compilation_config=SimpleNamespace(static_forward_context=context),
            cache_config=SimpleNamespace(num_gpu_blocks_override=None, block_size=BLOCK_SIZE),
            model_config=SimpleNamespace(max_model_len=self.max_model_len),
            scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False),
        )
        core = SimpleNamespace(model_executor=executor)
        initialize_kv_caches_keeping_configs(core, vllm_config)  # F3, with vLLM's own config helpers
        self.llm_engine = SimpleNamespace(
            model_executor=executor, engine_core=SimpleNamespace(engine_core=core), vllm_config=vllm_config
        )
        self._slot_tokens = slot_blocks * BLOCK_SIZE
        # vLLM seeds its sampling stream from `seed` once, at engine start; a resumed run must continue the
        # stream where the saved run left it, so the actor's checkpoint (same process) carries its state.
        self._generator = torch.Generator().manual_seed(int(seed or 0))
        rng.register_generator(SAMPLING_GENERATOR, self._generator)
        self._request_ids = itertools.count()

    # ---- verl's calls --------------------------------------------------------------------------
    def sleep(self, level: int = 1) -> None:
        life = RolloutLifecycle(self)
        life.free_cache_engine()
        life.offload_model_weights()

    def wake_up(self, tags: list[str] | None = None) -> None:
        life = RolloutLifecycle(self, device="cpu")
        if tags is None or "weights" in tags:
            life.onload_model_weights()
        if tags is None or "kv_cache" in tags:
            life.init_cache_engine()

    def get_tokenizer(self) -> None:
        return None

    def generate(
        self,
        prompts: Any = None,
        sampling_params: Any = None,
        use_tqdm: bool = False,
        lora_request: Any = None,
        **kwargs: Any,
    ) -> list[Any]:
        # deferred: importing this module must not load vLLM; it loads once the prelude patched it
        from vllm import SamplingParams

        requests = [_prompt_ids(p) for p in (prompts if isinstance(prompts, list) else [prompts])]
        params = (
            sampling_params
            if isinstance(sampling_params, list)
            else [sampling_params or SamplingParams()] * len(requests)
        )
        runner = self.llm_engine.model_executor.runner
        if not runner.kv_caches:
            raise RuntimeError("the KV cache is freed: init_cache_engine() (or wake_up) before generate")

        if is_placeholder(next(runner.model.parameters()).data):
            raise RuntimeError("the weights are offloaded: onload_model_weights() and a weight load before generate")
        seqs = [(i, j, requests[i], params[i]) for i in range(len(requests)) for j in range(params[i].n)]
        results: dict[tuple[int, int], tuple[list[int], list[float], str]] = {}
        for start in range(0, len(seqs), self.max_num_seqs):
            batch = seqs[start : start + self.max_num_seqs]
            by_params: dict[int, list] = {}
            for s in batch:  # one decode loop per distinct SamplingParams object
                by_params.setdefault(id(s[3]), []).append(s)
            for group in by_params.values():
                for (i, j, _, _), out in zip(group, self._decode(group, runner)):
                    results[(i, j)] = out
        return [self._request_output(i, requests[i], params[i], results) for i in range(len(requests))]

    # ---- decoding ------------------------------------------------------------------------------
    @torch.no_grad()
    def _decode(self, group: list, runner: StandinModelRunner) -> list[tuple[list[int], list[float], str]]:
        sp = group[0][3]
        prompts = [s[2] for s in group]
        batch, longest = len(prompts), max(len(p) for p in prompts)
        max_tokens = sp.max_tokens if sp.max_tokens is not None else self.max_model_len - longest
        if longest + max_tokens > self._slot_tokens:
            raise ValueError(
                f"prompt ({longest}) + max_tokens ({max_tokens}) exceeds max_model_len {self.max_model_len}"
            )
        ids = torch.full((batch, longest), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((batch, longest), dtype=torch.long)
        for b, p in enumerate(prompts):  # left padding: every sequence ends at the same column
            ids[b, longest - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[b, longest - len(p) :] = 1
        qk = runner.model.config.qk_nope_head_dim + runner.model.config.qk_rope_head_dim
        cache = kv.BlockKVCache(runner.kv_caches, self._slot_tokens, qk, batch)
        stops = set() if sp.ignore_eos else _as_set(self.eos_token_id) | set(sp.stop_token_ids or [])
        generator = torch.Generator().manual_seed(sp.seed) if sp.seed is not None else self._generator
        tokens: list[list[int]] = [[] for _ in range(batch)]
        logps: list[list[float]] = [[] for _ in range(batch)]
        reasons = ["length"] * batch
        done = torch.zeros(batch, dtype=torch.bool)
        step_ids, past = ids, 0
        for step in range(max_tokens):
            progress.unit("engine step", step + 1)  # hang diagnosis (CPU stand-in only; vLLM on NPU has none)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, past:]
            out = runner.model(
                step_ids,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
                cache_position=torch.arange(past, mask.shape[1]),
            )
            past = mask.shape[1]
            nxt, lp = sample(out.logits[:, -1, :], sp.temperature, sp.top_k, sp.top_p, generator)
            for b in range(batch):
                if done[b]:
                    continue
                tokens[b].append(int(nxt[b]))
                logps[b].append(float(lp[b]))
                if int(nxt[b]) in stops:
                    done[b], reasons[b] = True, "stop"
            if bool(done.all()):
                break
            step_ids = torch.where(done, torch.full_like(nxt, self.pad_token_id), nxt).unsqueeze(-1)
            mask = torch.cat([mask, (~done).long().unsqueeze(-1)], dim=-1)
        return [(tokens[b], logps[b], reasons[b]) for b in range(batch)]

    def _request_output(self, i: int, prompt: list[int], sp: Any, results: dict) -> Any:
        # deferred: importing this module must not load vLLM; it loads once the prelude patched it
        from vllm.outputs import CompletionOutput, RequestOutput
        from vllm.sequence import Logprob

        outputs = []
        for j in range(sp.n):
            toks, lps, reason = results[(i, j)]
            logprobs = None if sp.logprobs is None else [{t: Logprob(logprob=lp)} for t, lp in zip(toks, lps)]
            outputs.append(
                CompletionOutput(
                    index=j,
                    text="",
                    token_ids=toks,
                    cumulative_logprob=sum(lps),
                    logprobs=logprobs,
                    finish_reason=reason,
                )
            )
        return RequestOutput(
            request_id=str(next(self._request_ids)),
            prompt=None,
            prompt_token_ids=prompt,
            prompt_logprobs=None,
            outputs=outputs,
            finished=True,
        )


def _ensure_vllm_parallel_state(tp: int) -> None:
    """vLLM's LLM (external_launcher) brings up vllm.distributed's groups over the job's process group;
    verl's weight sync reads the rollout TP size from them. The stand-in does the same, over gloo."""
    # deferred: importing this module must not load vLLM; it loads once the prelude patched it
    from vllm.distributed import parallel_state as ps

    if not dist.is_initialized() or ps.model_parallel_is_initialized():
        return
    ps.init_distributed_environment(
        world_size=dist.get_world_size(),
        rank=dist.get_rank(),
        distributed_init_method="env://",
        local_rank=env_registry.integer("LOCAL_RANK"),
        backend="gloo",
    )
    ps.ensure_model_parallel_initialized(tp, 1)


def _as_set(value: Any) -> set[int]:
    if value is None:
        return set()
    return set(value) if isinstance(value, (list, tuple, set)) else {int(value)}


def _prompt_ids(prompt: Any) -> list[int]:
    if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
        return [int(t) for t in prompt["prompt_token_ids"]]
    raise TypeError("the CPU rollout stand-in takes token-id prompts ({'prompt_token_ids': [...]}), as verl passes")


def _safetensors_weights(model_dir: Path):
    # lazy: safetensors is heavy and only this path needs it; importing this module stays light
    from safetensors import safe_open

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors weights (use load_format='dummy' for random init)")
    for f in files:
        with safe_open(str(f), framework="pt") as handle:
            for name in handle.keys():
                yield name, handle.get_tensor(name)
