"""The training engine's bring-up on MindSpeed-LLM + MindSpeed + Megatron core_r0.8.0 (vendor items D1-D4).

Pure parts: `translate.translate_verl_train_configs_to_megatron` (verl config + HF config.json ->
MindSpeed-LLM arguments), `megatron_config.MegatronConfig` (the whitelist), `argv.parse_args_from_config`
(arguments -> argv). Execution: `initialize.initialize_megatron` (argument parsing, MindSpeed adaptor,
torch.distributed reuse, parallel state tp-cp-ep-dp-pp). `model.build_gpt_model` builds MindSpeed-LLM's
DeepSeek-V3 GPTModel for the current parallel state; see its docstring for the exact calls. `actor_state`
saves and loads the actor's per-rank state into a step checkpoint (`verl_patches.checkpoint`).
"""
