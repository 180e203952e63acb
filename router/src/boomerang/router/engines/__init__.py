"""The engines wing: what the router knows of its engines, and how it calls them.

`endpoints.py` (engines, load, health, revision), `discovery.py` and `health.py` (where they
are, active probes), `idle_probe.py` (an idle decoder's time per token), `capabilities.py`;
`upstream.py` is the facade of every engine call over `engine_http.py` and `engine_conn.py`,
with `failover.py`'s one retry policy; `kvevents.py`, `kvindex.py` and `blockhash.py` follow
every engine's KV cache into one index.
"""
