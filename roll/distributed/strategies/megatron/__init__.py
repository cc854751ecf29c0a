"""The `megatron` training engine (megatron-core; TP/PP over gloo on CPU, NCCL on GPU).

- `train`: `MegatronTrainStrategy`, the `torch` strategy's step around a megatron-core `GPTModel`.
- `model`: the `GPTModel` built from an HF config, called like an HF causal LM.
- `convert`: HF weights <-> megatron-core weights and their tensor-parallel shards.
- `parallel`, `pipeline`: what model-parallel ranks do together; pipeline parallel as autograd.
- `lora`: LoRA adapters around megatron-core's parallel linear layers.

Only `train` is named by the registry; nothing here is imported unless `megatron` is chosen.
"""
