"""What starts an engine: the `boomerang-engine` entrypoint (`entrypoint.py`: resolves the
model, renders vLLM's arguments from `boomerang.connector.config`, then runs vLLM), the engine
venv of the local runtime (`engine_venv.py` over `install-engine.sh`), the builtin models
(`model.py`), the engine image's build-time check (`image_check.py`) and the EFA probe
(`efa_probe.py`). What runs inside vLLM once it started is `plugin/`.
"""
