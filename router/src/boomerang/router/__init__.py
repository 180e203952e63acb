"""The Boomerang router: OpenAI-compatible, KV-cache-aware, exact about vLLM's bidirectional
protocol. Entry points: `boomerang.router.app.create_app` and `boomerang-router`."""
