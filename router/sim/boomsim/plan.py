"""`make sim ARGS="plan ..."`: what a `DisaggregatedDeployment` would give on a recorded
workload, at its own size and at others, under its own policy and the peers'.

Why: sizing a P/D cluster is a guess without it (how many decoders per prefill engine, which
TTL, whether reuse pays on this traffic), and the simulator already runs the router's own
decisions on cost-modelled engines. The planner reads what an operator has: the manifest
(its replicas, its KV transfer settings: bidirectional, threshold, the decoder TTL, the tuning
mode) and a trace (`trace.py`: the router's own JSON log, or OpenAI-format conversations), and
prints, for each candidate P:D size and policy, the figures of the sweeps (`sweep.markdown`):
first turn, follow-up TTFT p50 and p99, TPOT, goodput, paths. The manifest's own size and
policy are marked. Every figure is **simulated** on a profile (`--profile`, the H200 one by
default: `docs/simulation.md` says what is fitted and what is assumed).

The local CPU stack's own runs are predicted against what they measured by `cpu.py` (`make
sim ARGS=cpu`), from the fair benchmark's recorded runs. Not yet: planning on the CPU profile,
and reading engines' metrics or the router's learned costs for calibration.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from boomsim.cluster import Topology
from boomsim.policies import POLICIES, Settings
from boomsim.profiles import PROFILES
from boomsim.run import Load, run
from boomsim.sweep import FIGURES, markdown
from boomsim.trace import Trace, from_conversations, from_router_log

PEERS = ("affinity", "decode-first-2048", "dynamo-load")
"""The peers each plan compares with by default: affinity, and the two strongest on the
sweeps (`docs/simulation.md`)."""
SIZE = re.compile(r"^(\d+)P(\d+)D$")


@dataclass(frozen=True)
class Deployment:
    """What the planner reads from a manifest."""

    name: str
    prefill: int
    decode: int
    policy: str
    decoder_ttl_s: float
    recompute_threshold: int


def read_manifest(path: Path) -> Deployment:
    """A `DisaggregatedDeployment`, validated as the API server would admit it."""
    from boomerang.operator.api import DisaggregatedDeployment, parse_duration

    dd = DisaggregatedDeployment.model_validate(yaml.safe_load(path.read_text()))
    kv = dd.spec.kv_transfer
    policy = kv.tuning.mode.lower() if kv.bidirectional else "affinity"
    return Deployment(
        name=str(dd.metadata.get("name", "deployment")),
        prefill=dd.spec.prefill.replicas or 1,
        decode=dd.spec.decode.replicas or 1,
        policy=policy,
        decoder_ttl_s=float(parse_duration(kv.decoder_blocks_ttl)),
        recompute_threshold=kv.recompute_threshold,
    )


def read_trace(path: Path, rate_per_s: float) -> Trace:
    """The router's JSON log (lines), or OpenAI-format conversations (one JSON document)."""
    text = path.read_text()
    if text.lstrip().startswith("["):
        return from_conversations(json.loads(text), rate_per_s)
    return from_router_log(text.splitlines())


def sizes(d: Deployment, asked: Sequence[str]) -> list[tuple[int, int]]:
    """The candidate sizes: those asked (`2P4D`), else the manifest's own, one decoder fewer
    and more, and twice the prefill engines."""
    if asked:
        out = []
        for s in asked:
            m = SIZE.match(s.strip())
            if m is None or int(m[1]) < 1 or int(m[2]) < 1:
                raise ValueError(f"a size is written like 1P2D, not {s!r}")
            out.append((int(m[1]), int(m[2])))
        return list(dict.fromkeys(out))
    own = (d.prefill, d.decode)
    more = [(d.prefill, d.decode + 1), (d.prefill * 2, d.decode)]
    fewer = [(d.prefill, d.decode - 1)] if d.decode > 1 else []
    return list(dict.fromkeys([own, *fewer, *more]))


def plan(
    d: Deployment,
    trace: Trace,
    *,
    profile: str = "h200",
    candidates: Sequence[tuple[int, int]] = (),
    policies: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """One row per size and policy (`sweep`'s figures), the manifest's own marked `*`."""
    if not trace.sessions:
        raise ValueError("the trace has no turn to replay")
    chosen = list(dict.fromkeys([d.policy, *(policies or PEERS)]))
    if unknown := [p for p in chosen if p not in POLICIES]:
        raise ValueError(f"unknown policies {unknown}; known: {', '.join(POLICIES)}")
    load = Load(replay=tuple(trace.sessions))
    rows = []
    for p, dd in candidates or [(d.prefill, d.decode)]:
        for policy in chosen:
            settings = Settings(
                policy,
                recompute_threshold=d.recompute_threshold,
                decoder_ttl_s=d.decoder_ttl_s,
            )
            r = run(PROFILES[profile](), Topology(p, dd), settings, iter(()), load)
            mark = "*" if (p, dd, policy) == (d.prefill, d.decode, d.policy) else ""
            s = r.summary
            rows.append(
                {
                    "size": f"{p}P{dd}D{mark}",
                    "policy": policy,
                    **{k: s[k] for k in (*FIGURES, "turns", "paths")},
                }
            )
    return rows


def main(argv: Sequence[str]) -> None:
    ap = argparse.ArgumentParser(prog="boomsim plan", description=__doc__.splitlines()[0])
    ap.add_argument("--manifest", type=Path, required=True, help="a DisaggregatedDeployment")
    ap.add_argument("--trace", type=Path, required=True, help="router JSON log or conversations")
    ap.add_argument("--rate", type=float, default=1.0, help="conversations: arrivals a second")
    ap.add_argument("--sizes", default="", help="candidate sizes, e.g. 1P2D,2P4D")
    ap.add_argument("--policies", default="", help=f"compared (default {','.join(PEERS)})")
    ap.add_argument("--profile", default="h200", choices=sorted(PROFILES))
    ap.add_argument("--json", type=Path, help="also write the rows here")
    a = ap.parse_args(argv)
    d = read_manifest(a.manifest)
    trace = read_trace(a.trace, a.rate)
    candidates = sizes(d, [s for s in a.sizes.split(",") if s])
    policies = [p for p in a.policies.split(",") if p]
    rows = plan(d, trace, profile=a.profile, candidates=candidates, policies=policies)
    print(
        f"{d.name}: {trace.turns} turns in {len(trace.sessions)} conversations replayed on the "
        f"{a.profile} profile (SIMULATED); * marks the manifest's own size and policy"
    )
    if trace.dropped_turns:
        print(f"{trace.dropped_turns} turns of the trace had no token count: not replayed")
    for note in trace.notes:
        print(note)
    print("\n" + markdown(rows, "size"))
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1) + "\n")
