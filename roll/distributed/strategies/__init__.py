"""Engines behind the worker roles, one module each.

- `registry`: ROLL's strategy names -> engine classes, and `build_train_strategy` (the factory).
- `torch_train`: `TorchTrainStrategy`, plain PyTorch training on CPU or one GPU (actor, critic).
- `hf_infer`: transformers generation for the inference worker.
- `vllm_infer`, `sglang_infer`: vLLM and SGLang behind the same interface (optional packages,
  imported only when chosen; `engine_api` holds what they share).

Modules are imported by path (`roll.distributed.strategies.torch_train`) so that a process that
only generates never imports the training stack, and the other way round.
"""
