"""The Boomerang router: OpenAI-compatible, KV-cache-aware, exact about vLLM's bidirectional protocol."""
