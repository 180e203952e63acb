"""What Adaptive tuning has learned, as status reports it: pure mappings, no I/O.

The router learns the pull/recompute break-even, the retention of D's blocks and which path
each turn takes, and says so at `GET /boomerang/v1/state` (routerstate.py reads it). Status
reports it under `status.kvTransfer` (`EffectiveKVTransfer`) for Adaptive deployments only:
- `learned(state)` maps the router's answer to status fields, rounded (tokens, seconds,
  percents) so that a settled router reports the same values poll after poll;
- `in_force(previous, reported, now)` is what status holds: the last report, with
  `observedAt` moved only when a value changed, so an unchanged report writes no status.
The values are informational: a router that cannot be read leaves the last ones in place.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from boomerang.facts import state
from boomerang.operator.api import DisaggregatedDeployment

LEARNED_FIELDS = (
    "breakEvenTokens",
    "retentionSeconds",
    "pathShares",
    "retainedBlocks",
    "retainedPercent",
    "tpotBoundMilliseconds",
    "ttftBoundMillisecondsAt1kTokens",
)
"""The status fields (wire names) that come from the router."""
OBSERVED_AT = "observedAt"
_COUNTS = {
    state.BREAK_EVEN_TOKENS: "breakEvenTokens",
    state.RETENTION_S: "retentionSeconds",
    state.RETAINED_BLOCKS: "retainedBlocks",
}


def adaptive(dd: DisaggregatedDeployment) -> bool:
    return dd.spec.kv_transfer.tuning.router_mode == "adaptive"


def _number(value: Any) -> float | None:
    """A non-negative finite number; None for anything else (a bool is not one)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value) if value >= 0 else None


def _count(value: Any) -> int | None:
    number = _number(value)
    return None if number is None else round(number)


def path_shares(paths: Any) -> dict[str, int] | None:
    """Turns per path as whole percents (None before the first turn)."""
    if not isinstance(paths, Mapping):
        return None
    counts = {path: _count(paths.get(path, 0)) for path in state.PATHS}
    if any(n is None for n in counts.values()):
        return None
    total = sum(n or 0 for n in counts.values())
    if total == 0:
        return None
    return {path: round(100 * (n or 0) / total) for path, n in counts.items()}


def learned(doc: Any) -> dict[str, Any] | None:
    """The status fields in the router's state document (`boomerang.facts.state`); None when the
    router does not run adaptive (it has not reloaded its tuning yet) or its answer is not a
    state object. Values missing or malformed in it are left out."""
    if not isinstance(doc, Mapping) or doc.get(state.MODE) != "adaptive":
        return None
    found: dict[str, Any] = {}
    for key, name in _COUNTS.items():
        value = _count(doc.get(key))
        if value is not None:
            found[name] = value
    shares = path_shares(doc.get(state.PATH_COUNTS))
    if shares is not None:
        found["pathShares"] = shares
    found.update(slo_bounds(doc.get(state.SLO)))
    fraction = _number(doc.get(state.RETAINED_FRACTION))
    if fraction is not None:
        found["retainedPercent"] = min(100, round(100 * fraction))
    return found


def slo_bounds(slo: Any) -> dict[str, int]:
    """The router's SLO bounds in force as status fields, in whole milliseconds (none when the
    router chooses without them)."""
    if not isinstance(slo, Mapping):
        return {}
    found: dict[str, int] = {}
    tpot = _number(slo.get("tpot_s"))
    if tpot is not None:
        found["tpotBoundMilliseconds"] = round(1000 * tpot)
    ttft = slo.get("ttft_s")
    at = _number(ttft.get(str(state.SLO_AT[0]))) if isinstance(ttft, Mapping) else None
    if at is not None:
        found["ttftBoundMillisecondsAt1kTokens"] = round(1000 * at)
    return found


def from_status(status: Mapping[str, Any] | None) -> dict[str, Any]:
    """The learned fields (and `observedAt`) a status holds."""
    kv = (status or {}).get("kvTransfer") or {}
    return {k: kv[k] for k in (*LEARNED_FIELDS, OBSERVED_AT) if k in kv}


def in_force(
    previous: Mapping[str, Any] | None, reported: Mapping[str, Any] | None, now: str
) -> dict[str, Any]:
    """What status reports: the router's latest values (`reported`, None: none since the
    operator started), stamped `observedAt` when they last changed; else the previous ones."""
    before = from_status(previous)
    if reported is None:
        return before
    if {k: v for k, v in before.items() if k != OBSERVED_AT} == dict(reported):
        return before
    return {**reported, OBSERVED_AT: now}
