"""What runs inside vLLM's processes: Boomerang's plugin (`register.py`, loaded through vLLM's
`vllm.general_plugins` entry point) and everything it applies there.

The lease API and D's retained leases (`lease_api.py`, `leases.py`, `retained.py`,
`pressure.py`, `own_requests.py`), the request ids and stream params the router reads
(`api_ids.py`), the gauges it publishes (`revision.py`, `capability.py`), and the CPU fixes
(`nixl_quiet.py`, `cpu_pinning.py`, `idle_policy.py`, `idle_loop.py`), each checked against the
vLLM it patches (`vllm_points.py`). Nothing here starts an engine: that is `launch/`.
"""
