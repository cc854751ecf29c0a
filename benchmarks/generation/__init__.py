"""The inference engines: decoding paths, continuous batching, KV reuse across turns, the Ray hop."""
