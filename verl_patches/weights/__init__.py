"""DeepSeek-V3 weight preparation: training config, FP8->BF16, HF<->Megatron (MindSpeed-LLM) checkpoints.

Modules (one job each; importing any of them has no side effects):
- ``config``        official / tiny / training ``config.json`` and its validation
- ``dequant``       block-wise FP8 dequantisation (vectorised) and a float32 reference
- ``st_reader``     lazy, memory-mapped access to a sharded safetensors checkpoint
- ``fp8_cast``      streaming, resumable FP8->BF16 checkpoint conversion
- ``names``         Megatron (MindSpeed-LLM DSV3) <-> HF parameter name table (also used at runtime)
- ``layout``        parallel layout (TP/PP/EP, layer list, TP-extend-EP) planning and validation
- ``tensor_layout`` how each HF tensor is split into / merged from Megatron rank shards
- ``hf_to_mcore``   HF -> legacy Megatron checkpoint, one rank at a time
- ``mcore_to_hf``   legacy Megatron checkpoint -> HF safetensors
- ``verify``        tensor-by-tensor verification of both directions
"""
