"""The `hf` inference engine (transformers, CPU and GPU), one module per part.

- `infer`: `HFInferStrategy`, the engine the inference worker drives (`generate`, prefix caching).
- `continuous`: continuous batching, requests joining a running decode batch between two steps.
- `prefill`, `kv_cache`: a batch's prefill and the per-session KV cache it reuses.
- `static_decode`, `slot_serving`: decode slots (a static KV cache per batch-size bucket, CUDA
  graphs on a GPU) and the loop that serves them.
- `device_sampling`: sampling on the device with a random stream per request.
- `decode_attention`: the `roll_sdpa` attention of single-token decode queries.
"""
