"""Boomerang's benchmarks of the whole system, one family per folder (README.md).

Every family runs the real stack on this machine: vLLM's CPU build with NIXL, the router and
the engine plugin as `boomerang up` starts them. What they share (processes, vLLM's own
multi-turn client, stock engines, idle checks) is `harness/`; what they publish is `results/`.
"""
