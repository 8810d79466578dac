"""The reference engine: model, KV cache, static buffers, attention backends and the model runner."""
