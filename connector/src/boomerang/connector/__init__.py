"""The vLLM side of Boomerang: kv-transfer config, engine entrypoint, plugin, engine install."""
