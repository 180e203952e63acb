"""Online weighted least squares with forgetting, a prior and coefficients >= 0 (pure).

The cost model (`costmodel.py`) fits three tiny linear models of the engines' latency, online,
on every turn. This is that fitting, apart from what is fitted: no numerical library, because
the systems are at most 4x4 and the router must not grow a heavy dependency for them.

- Forgetting: each observation multiplies the old ones' weight by 2**(-1/half_life), so the
  fit follows a change of load or hardware within a few half-lives (counted in observations).
- Relative error: timing noise grows with the time, so each point is weighted by 1 / its
  predicted seconds squared (short turns pin the fixed costs, long ones the per-token costs).
- Prior: pseudo-observations at typical points, worth `prior_weight` observations at first and
  fading like real ones down to `prior_floor`, so a handful of noisy points cannot swing the
  fit, and a fit fed one point only stays well posed (the prior decides the split).
- Non-negative: the solution minimises the weighted squared error over coefficients >= 0,
  exactly (an active-set search over the at most 16 subsets of free coefficients). The search
  tries the previous solution's free coefficients first: one observation rarely changes which
  coefficients are pinned at 0, so the usual observation costs one solve, not the six or so a
  search from the full set took in the router benchmark (about 15 % of a routed turn's CPU).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import chain, combinations
from typing import Final

_MIN_PREDICTED_S: Final = 1e-3
"""Weights stop growing below this prediction (seconds)."""


class ForgettingFit:
    """y ~ theta . x, fitted online; `theta` is the current solution (the prior until fed)."""

    def __init__(
        self,
        prior: Sequence[float],
        points: Sequence[Sequence[float]],
        *,
        half_life: float,
        prior_weight: float,
        prior_floor: float,
    ) -> None:
        n, weights = len(prior), [_weight(x, prior) / len(points) for x in points]
        self._decay = 0.5 ** (1.0 / half_life)
        self._a0 = [[0.0] * n for _ in range(n)]
        for w, x in zip(weights, points, strict=True):
            _accumulate(self._a0, x, w)
        self._b0 = [sum(self._a0[i][j] * prior[j] for j in range(n)) for i in range(n)]
        self._a = [[0.0] * n for _ in range(n)]
        self._b = [0.0] * n
        self._weight, self._floor = prior_weight, prior_floor
        self.theta = list(prior)
        self.count = 0
        self._free: tuple[int, ...] | None = None
        """The free coefficients of the last solution: where the next search starts."""

    def add(self, x: Sequence[float], y: float) -> None:
        """One observation (finite, checked by the caller)."""
        d, n, w = self._decay, len(x), _weight(x, self.theta)
        for i in range(n):
            self._b[i] = d * self._b[i] + w * x[i] * y
            self._a[i] = [d * a for a in self._a[i]]
        _accumulate(self._a, x, w)
        self._weight = max(self._floor, self._weight * d)
        self.count += 1
        w = self._weight
        m = [[self._a[i][j] + w * self._a0[i][j] for j in range(n)] for i in range(n)]
        v = [self._b[i] + w * self._b0[i] for i in range(n)]
        theta, free = nonnegative_solve(m, v, self._free)
        if all(math.isfinite(t) for t in theta):
            self.theta, self._free = theta, free


def _weight(x: Sequence[float], theta: Sequence[float]) -> float:
    predicted = sum(a * b for a, b in zip(x, theta, strict=True))
    return 1.0 / max(_MIN_PREDICTED_S, predicted) ** 2


def _accumulate(m: list[list[float]], x: Sequence[float], w: float) -> None:
    for i, xi in enumerate(x):
        for j, xj in enumerate(x):
            m[i][j] += w * xi * xj


def solve(m: list[list[float]], v: list[float]) -> list[float] | None:
    """x with m x = v (Gaussian elimination, partial pivoting); None when singular."""
    n = len(v)
    rows = [[*m[i], v[i]] for i in range(n)]
    scale = max(abs(m[i][i]) for i in range(n)) or 1.0
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(rows[r][col]))
        if abs(rows[pivot][col]) <= 1e-12 * scale:
            return None
        rows[col], rows[pivot] = rows[pivot], rows[col]
        for r in range(col + 1, n):
            f = rows[r][col] / rows[col][col]
            for k in range(col, n + 1):
                rows[r][k] -= f * rows[col][k]
    x = [0.0] * n
    for i in reversed(range(n)):
        x[i] = (rows[i][n] - sum(rows[i][k] * x[k] for k in range(i + 1, n))) / rows[i][i]
    return x


def nonnegative_solve(
    m: list[list[float]], v: list[float], first: tuple[int, ...] | None = None
) -> tuple[list[float], tuple[int, ...] | None]:
    """argmin over theta >= 0 of theta' m theta - 2 v' theta (m positive definite), and the
    free coefficients it was solved on (None: no subset passed, the best feasible one seen).

    The optimum solves m x = v on some subset of free variables, the others held at 0, with a
    non-negative gradient there (KKT: sufficient, and the optimum is unique by strict
    convexity, so the first subset that passes is the answer whichever order they are tried
    in). `first` (the last solution's subset) is tried first, then the others largest first.
    Rounding may leave no subset exactly KKT: then the best feasible one seen."""
    n, tol = len(v), 1e-9 * max(abs(g) for g in v)
    best, best_f = [0.0] * n, 0.0
    everything = (c for k in range(n, 0, -1) for c in combinations(range(n), k))
    for free in chain([first] if first else [], everything):
        x = solve([[m[i][j] for j in free] for i in free], [v[i] for i in free])
        if x is None or min(x) < 0:
            continue
        theta = [0.0] * n
        for i, xi in zip(free, x, strict=True):
            theta[i] = xi
        held = [i for i in range(n) if i not in free]
        if all(sum(m[i][j] * theta[j] for j in free) - v[i] >= -tol for i in held):
            return theta, free
        f = -sum(v[i] * xi for i, xi in zip(free, x, strict=True))  # objective at m x = v
        if f < best_f:
            best_f, best = f, theta
    return best, None
