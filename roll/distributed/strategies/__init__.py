"""Engines behind the worker roles.

- `base`: `TrainStrategy` and `InferStrategy`, the interfaces the worker roles call.
- `registry`: ROLL's strategy names -> engine classes, and `build_train_strategy` (the factory).
- `torch_train`: `TorchTrainStrategy`, plain PyTorch training on CPU or one GPU (actor, critic);
  the other training engines subclass it.
- `deepspeed_train`, `fsdp2_train`: one file each (ZeRO; PyTorch's FSDP2).
- `megatron/`: megatron-core (TP/PP), a folder of its own (model, conversion, parallel, LoRA).
- `hf/`: transformers generation for the inference worker, a folder of its own (decode slots,
  prefill, KV cache, continuous batching, sampling on the device).
- `vllm_infer`, `sglang_infer`: vLLM and SGLang behind the same interface (optional packages,
  imported only when chosen; `engine_api` holds what they share).
- `offload`, `process_group`: helpers shared by several engines.

Modules are imported by path (`roll.distributed.strategies.torch_train`) so that a process that
only generates never imports the training stack, and the other way round.
"""
