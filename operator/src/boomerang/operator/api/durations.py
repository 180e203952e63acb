"""Go-style durations (`480s`, `1h30m`), parsed as the API server's CEL `duration()` reads them.

Why a module of its own: admission rules compare durations in CEL while the operator and the
local runtime compare them in Python; both must agree to the nanosecond, even at the schema's
bounds, so the parsing mirrors Go's `time.ParseDuration` and is tested on its own.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, WithJsonSchema

DURATION_RE = r"^([0-9]{1,5}([.][0-9]+)?(ms|s|m|h)){1,4}$"
"""A duration: Go's syntax (`480s`, `8m`, `1h30m`, `0.5s`), at most four parts of at most five
digits before the point. So at most 400,000 hours, far below Go's limit (about 2.56 million):
every duration the schema admits converts in CEL's `duration()`, and no rule fails to
evaluate on one (past the limit the conversion fails). No backslash, so that a CEL string
literal carries it unchanged."""
_DURATION_PART = re.compile(r"([0-9]+)(?:\.([0-9]+))?(ms|s|m|h)")
NS_PER_S = 10**9
_UNIT_NS = {"ms": 10**6, "s": NS_PER_S, "m": 60 * NS_PER_S, "h": 3600 * NS_PER_S}
MAX_DURATION_NS = 2**63 - 1
"""Go's (and so CEL's) longest duration, about 292 years: longer ones fail to parse there
(`DURATION_RE` admits none)."""


def duration_ns(value: str) -> int:
    """Nanoseconds in a Go-style duration (`480s`, `8m`, `1h30m`), as CEL's `duration()` reads it.

    Computed the way Go's `time.ParseDuration` (which CEL calls) does, down to its float rounding
    of fractions, so that a rule comparing durations gives the same answer here and in the API
    server, even at its bounds. The pattern keeps every duration far below Go's longest.
    """
    if not re.fullmatch(DURATION_RE, value):
        raise ValueError(
            f"invalid duration {value!r}: up to four numbers of at most five digits, each with "
            f"ms, s, m or h, e.g. 480s or 1h30m"
        )
    total = 0
    for whole, fraction, unit in _DURATION_PART.findall(value):
        total += int(whole) * _UNIT_NS[unit] + _fraction_ns(fraction, _UNIT_NS[unit])
    return total


def _fraction_ns(digits: str, unit_ns: int) -> int:
    """Go's `leadingFraction`: the digits that fit an int64 count, then one float64 product."""
    numerator, scale = 0, 1.0
    for digit in digits:
        if numerator > MAX_DURATION_NS // 10 or numerator * 10 + int(digit) > 2**63:
            break
        numerator, scale = numerator * 10 + int(digit), scale * 10
    return int(float(numerator) * (float(unit_ns) / scale)) if numerator else 0


def parse_duration(value: str) -> float:
    """Seconds in a Go-style duration (see `duration_ns`)."""
    return duration_ns(value) / NS_PER_S


def _check_duration(value: Any) -> Any:
    if isinstance(value, str):
        parse_duration(value)
    return value


Duration = Annotated[
    str,
    BeforeValidator(_check_duration),
    WithJsonSchema({"type": "string", "pattern": DURATION_RE}),
]
