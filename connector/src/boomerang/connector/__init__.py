"""The vLLM side of Boomerang: kv-transfer config, engine entrypoint, plugin, local runtime."""
