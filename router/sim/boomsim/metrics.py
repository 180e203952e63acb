"""Per-turn records and their summary: TTFT and TPOT percentiles, paths, throughput, goodput.

Why compact: a million turns must fit and summarise quickly, so a turn is a few numbers in
flat arrays (no object per turn), first turns and follow-ups apart (they answer different
questions: first turns measure queueing behind long prompts, follow-ups the reuse)."""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any


def percentile(values: array[float] | list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank on the sorted values; nan when empty."""
    if not values:
        return float("nan")
    s = sorted(values)
    i = min(len(s) - 1, max(0, round(q * (len(s) - 1))))
    return float(s[i])


@dataclass
class Metrics:
    def __post_init__(self) -> None:
        self.ttft_first: array[float] = array("d")
        self.ttft_follow: array[float] = array("d")
        self.tpot: array[float] = array("d")
        self.gap: array[float] = array("d")
        """Per stream of more than one token: its worst inter-token gap (the longest engine
        step while it generated; a prefill mixed into a decoder's step lengthens it)."""
        self.paths: dict[str, int] = {}
        self.out_tokens = 0
        self.turns = 0
        self.met = 0
        """Turns that met both SLO bounds (`slo.Slo`)."""
        self.first_at = float("inf")
        self.last_at = 0.0
        self.p_leg: array[float] = array("d")
        """The router's P leg (POST to P's answer), per P/D turn: the published "prefill
        duration"."""

    def started(self, t: float) -> None:
        self.first_at = min(self.first_at, t)

    def first_token(self, index: int, ttft: float, path: str) -> None:
        (self.ttft_first if index == 0 else self.ttft_follow).append(ttft)
        self.paths[path] = self.paths.get(path, 0) + 1

    def finished(
        self, answer: int, first_at: float, t: float, *, met: bool, gap: float = 0.0
    ) -> None:
        self.turns += 1
        self.met += met
        self.out_tokens += answer
        if answer > 1:
            self.tpot.append((t - first_at) / (answer - 1))
            self.gap.append(gap)
        self.last_at = max(self.last_at, t)

    def summary(self) -> dict[str, Any]:
        span = max(1e-9, self.last_at - self.first_at) if self.turns else float("nan")
        everything = array("d", self.ttft_first)
        everything.extend(self.ttft_follow)
        return {
            "turns": self.turns,
            "ttft_p50": percentile(everything, 0.5),
            "ttft_p99": percentile(everything, 0.99),
            "ttft_mean": sum(everything) / len(everything) if everything else float("nan"),
            "first_p50": percentile(self.ttft_first, 0.5),
            "first_p99": percentile(self.ttft_first, 0.99),
            "follow_p50": percentile(self.ttft_follow, 0.5),
            "follow_p99": percentile(self.ttft_follow, 0.99),
            "tpot_p50": percentile(self.tpot, 0.5),
            "tpot_p99": percentile(self.tpot, 0.99),
            "gap_p50": percentile(self.gap, 0.5),
            "gap_p99": percentile(self.gap, 0.99),
            "turns_per_s": self.turns / span,
            "goodput": self.met / span,
            "attainment": self.met / self.turns if self.turns else float("nan"),
            "out_tokens_per_s": self.out_tokens / span,
            "span_s": span,
            "p_leg_mean": sum(self.p_leg) / len(self.p_leg) if self.p_leg else float("nan"),
            "paths": dict(sorted(self.paths.items())),
        }
