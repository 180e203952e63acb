"""What every benchmark family shares: the machine's description, a P/D pair and its routers,
stock engines, vLLM's multi-turn client fetched at run time, idle and CPU checks, and where the
repository and the results are."""
