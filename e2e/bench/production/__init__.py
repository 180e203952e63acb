"""Boomerang against the production baseline and the peers' policies, measured by vLLM's own
multi-turn client (`run`): the modes and regimes, the engine sets, SLO goodput, the report and
the merging of sittings."""
