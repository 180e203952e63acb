"""Which path a turn takes, what each leg took, and what is in force: the cost model's I/O side.

Why it exists: `costmodel.py` is the pure model (choose a path for a shape, learn from
observations); the flow only knows turns. This module turns a verified turn into the model's
`Shape` and the live tuning into its `Bounds`, feeds the model what each leg took, counts the
paths that served turns (`boomerang_router_path_total{path}`, in both modes), sets the
coefficient and break-even gauges when `/metrics` is scraped (`refresh`: not on every
observation, where it cost a turn about a tenth of the router's CPU), and answers
`Router.state()`'s part.

The bounds are read from `config.tuning` at each turn, so a hot-reloaded tuning (`tuning.py`)
applies to the next turn. The engine's `recompute_threshold` is the floor of every break-even.
What is observed (always, also in `static` mode, so that switching to `adaptive` starts from
measurements; observing changes no `static` decision):
- the P leg (max_tokens 1, not streamed: its latency is P's time to first token) with the
  tokens P computed and the tokens it pulled (the verified ones when P had the handle and
  took it, else 0);
- D's time to first byte after P, and on the continue path, only for streamed answers: a
  non-streamed answer's first byte comes after the whole generation, which would teach the
  model the answer's length instead of D's prefill;
- each stream D finished (streamed answers with their token ids), first token to last, with
  the turns that got their first token on that D meanwhile, continued and handed over from P,
  and the other requests in flight there on average (`Endpoint.join`, `Endpoint.since`): what
  each turn joining D costs the streams D is decoding.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from boomerang.facts import state
from boomerang.router.config import RouterConfig
from boomerang.router.engines.endpoints import Joined
from boomerang.router.learning.costmodel import (
    Bounds,
    Choice,
    CostModel,
    Path,
    Shape,
    Slo,
    itl_budget,
    tpot_slo,
    ttft_slo,
)
from boomerang.router.metrics import Metrics


class PathBook:
    """The cost model of one router, its bounds, and the paths its turns took."""

    def __init__(self, config: RouterConfig, metrics: Metrics, model: CostModel | None = None):
        self.config = config
        self.metrics = metrics
        self.model = model or CostModel()
        self.counts: Counter[Path] = Counter({p: 0 for p in Path})
        self.refresh()

    @property
    def adaptive(self) -> bool:
        return self.config.tuning.mode == "adaptive"

    def bounds(self) -> Bounds:
        """The model's bounds now: the live tuning, the engine's threshold as the floor."""
        t = self.config.tuning
        return Bounds(
            floor_tokens=self.config.recompute_threshold,
            break_even_min_tokens=t.break_even_min_tokens,
            break_even_max_tokens=t.break_even_max_tokens,
            continue_on_decode=t.continue_on_decode,
            continue_max_suffix_tokens=t.continue_max_suffix_tokens,
            itl_budget_s=t.itl_budget_s,
            tpot_tolerance=t.continue_tpot_tolerance,
            slo=self.slo(),
        )

    def slo(self) -> Slo | None:
        """The turns' bounds in force (SLO-aware, adaptive), None when the ITL budget rules:
        the choice is off, or the operator pinned a budget per continue."""
        t = self.config.tuning
        if not (t.slo_aware and self.adaptive) or t.itl_budget_s is not None:
            return None
        return Slo(t.slo_scale, t.ttft_slo_s, t.tpot_slo_s)

    def choose(
        self, prompt_tokens: int, reusable_tokens: int, holder: bool, pullable: bool = True
    ) -> Choice:
        """The cheapest allowed path for a verified turn (`holder`: its decoder may serve it;
        `pullable`: D still pins the blocks)."""
        reusable = max(0, min(reusable_tokens, prompt_tokens))
        shape = Shape(prompt_tokens, reusable, holder, pullable)
        return self.model.choose(shape, self.bounds())

    def continue_stall(self, computed_tokens: int) -> float:
        """What a turn computing `computed_tokens` on a decoder stalls its streams (seconds)."""
        return self.model.coefficients().on_decoder_s(max(0, computed_tokens))

    def served(self, path: Path) -> None:
        """Count the path that served a turn."""
        self.counts[path] += 1
        self.metrics.path.labels(path).inc()

    def observe_prefill(
        self,
        prompt_ids: list[int] | None,
        answer: dict[str, Any],
        pulled: int,
        seconds: float,
        queued: float = 0.0,
        cached: int | None = None,
    ) -> None:
        """P's leg: the prompt's length is its verified ids', else P's own count; `queued`, the
        work sent to P before it and not yet answered then; `cached`, what P's answer says it
        did not compute (its prefix-cache hit plus what it pulled), when it says."""
        prompt = len(prompt_ids) if prompt_ids is not None else _prompt_tokens(answer)
        if prompt is None:
            return
        pulled = max(0, min(pulled, prompt))
        not_computed = max(pulled, min(cached or 0, prompt))
        self.model.observe_prefill(prompt - not_computed, pulled, seconds, max(0.0, queued))

    def observe_decode_first(self, prompt_tokens: int, seconds: float) -> None:
        self.model.observe_decode_first(prompt_tokens, seconds)

    def observe_continue(self, computed_tokens: int, seconds: float) -> None:
        self.model.observe_continue(max(0, computed_tokens), seconds)

    def observe_stream(self, output_tokens: int, seen: Joined, seconds: float) -> None:
        """A stream on D and what it saw there (`CostModel.observe_stream`)."""
        self.model.observe_stream(
            output_tokens, seen.continued, seen.handed_over, seen.others, seconds
        )

    def break_even_tokens(self) -> float:
        return float(self.model.break_even_tokens(self.bounds()))

    def refresh(self) -> None:
        """Set the coefficient and break-even gauges to the model's current values (called
        by the `/metrics` handler before each scrape)."""
        for name, value in self.model.coefficients().as_metrics().items():
            self.metrics.cost_coefficient.labels(name).set(value)
        self.metrics.break_even_tokens.set(self.break_even_tokens())

    def state(self, streams: Mapping[str, float] | None = None) -> dict[str, Any]:
        """The path choice's part of `GET /boomerang/v1/state`; `streams`, each decoder's
        measured stream time (`Endpoint.stream_s`), which its continue limit derives from."""
        bounds = self.bounds()
        limits = {
            url: {
                "stream_s": s,
                "itl_budget_s": itl_budget(bounds, s),
                "tokens": self.model.continue_limit_tokens(bounds, s),
            }
            for url, s in (streams or {}).items()
        }
        slo, c = self.slo(), self.model.coefficients()
        bounds_now = None
        if slo is not None:
            bounds_now = {
                "scale": slo.scale,
                "tpot_s": tpot_slo(c, slo),
                "ttft_s": {str(n): ttft_slo(c, slo, n) for n in state.SLO_AT},
            }
        return {
            state.SLO: bounds_now,
            state.MODE: self.config.tuning.mode,
            state.BREAK_EVEN_TOKENS: self.break_even_tokens(),
            state.CONTINUE_LIMIT_TOKENS: self.model.continue_limit_tokens(bounds),
            state.CONTINUE_LIMITS: limits,
            state.PATH_COUNTS: {str(p): n for p, n in self.counts.items()},
            state.COEFFICIENTS: self.model.coefficients().as_metrics(),
        }


def _prompt_tokens(answer: dict[str, Any]) -> int | None:
    usage = answer.get("usage")
    count = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return count if isinstance(count, int) else None
