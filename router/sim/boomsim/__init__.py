"""A discrete-event simulator of a P/D cluster that runs the router's own decisions.

Why it exists: every performance judgment of this project so far comes from two CPU cores and a
tiny model, where a prefill token, a KV transfer and a decode step cost nothing like they cost
on H200s over EFA, and no machine here can run 4P8D with thousands of sessions. The simulator
keeps the router's pure decisions (`boomerang.router.turn.plan`, `costmodel`, `affinity`,
`endpoints.LeastWorkAffinity`) and the connector's lease yield rules
(`boomerang.connector.plugin.retained`) unchanged, and replaces only the I/O: engines are cost
models (`profiles`, `engine`, `kvcache`), the network is a transfer-time formula, time is simulated
(`loop`). `docs/simulation.md` says what is modelled, what is not, and where each constant
comes from.
"""
