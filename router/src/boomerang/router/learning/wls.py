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
  tries the previous solution's free coefficients first: a few observations rarely change which
  coefficients are pinned at 0, so the usual search costs one solve, not the six or so a
  search from the full set took in the router benchmark (about 15 % of a routed turn's CPU).
- Cheap per observation: the fit is fed on every turn, in both modes, and read far less often
  (static mode: when `/metrics` is scraped; adaptive: once per verified turn). So an
  observation only updates the normal equations, in place and in one pass (decay, the new
  point, the prior's fading stopped at its floor); the system is solved when `theta` is read,
  or after `SOLVE_EVERY` observations, whichever comes first. Between solves a new point is
  weighted by the last solution's prediction, at most that many observations old: the weight
  only models the noise, and fed 2,000 noisy points the fit solved this way ends within 0.5 %
  of one solved after every point (a test holds it to that). The small systems are solved by
  elimination without pivoting, which their symmetric positive definite matrices allow.
  Together: 3x less CPU per turn for the router's learning (`bench_fit.py`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache
from itertools import combinations
from operator import mul
from typing import Final

_MIN_PREDICTED_S: Final = 1e-3
"""Weights stop growing below this prediction (seconds)."""
SOLVE_EVERY: Final = 16
"""Observations between solves when nothing reads the fit meanwhile."""


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
        a0 = [[0.0] * n for _ in range(n)]
        for w, x in zip(weights, points, strict=True):
            _accumulate(a0, x, w)
        self._a0 = a0
        self._b0 = [sum(a0[i][j] * prior[j] for j in range(n)) for i in range(n)]
        self._weight, self._floor = prior_weight, prior_floor
        self._m = [[prior_weight * a for a in row] for row in a0]
        self._v = [prior_weight * b for b in self._b0]
        """The normal equations solved: the observations, decayed, plus the prior at its
        current weight (`_weight` times `_a0`, `_b0`)."""
        self._theta = list(prior)
        self._unsolved = 0
        """Observations since the last solve."""
        self.count = 0
        self._free: tuple[int, ...] | None = None
        """The free coefficients of the last solution: where the next search starts."""

    @property
    def theta(self) -> list[float]:
        """The current solution (solved now if observations came since the last solve)."""
        if self._unsolved:
            self._solve()
        return self._theta

    def add(self, x: Sequence[float], y: float) -> None:
        """One observation (finite, checked by the caller)."""
        d, w, old = self._decay, _weight(x, self._theta), self._weight
        self._weight = max(self._floor, old * d)
        m, v = self._m, self._v
        for i, xi in enumerate(x):  # everything decays; the point comes in
            wxi = w * xi
            m[i] = [d * mij + wxi * xj for mij, xj in zip(m[i], x, strict=True)]
            v[i] = d * v[i] + wxi * y
        if extra := self._weight - old * d:  # 0 until the prior reaches its floor
            for i, (row, a0_row) in enumerate(zip(m, self._a0, strict=True)):
                m[i] = [mij + extra * a for mij, a in zip(row, a0_row, strict=True)]
                v[i] += extra * self._b0[i]
        self.count += 1
        self._unsolved += 1
        if self._unsolved >= SOLVE_EVERY:
            self._solve()

    def _solve(self) -> None:
        self._unsolved = 0
        theta, free = nonnegative_solve(self._m, self._v, self._free)
        if all(map(math.isfinite, theta)):
            self._theta, self._free = theta, free


def _weight(x: Sequence[float], theta: Sequence[float]) -> float:
    predicted: float = sum(map(mul, x, theta))
    return 1.0 / max(_MIN_PREDICTED_S, predicted) ** 2


def _accumulate(m: list[list[float]], x: Sequence[float], w: float) -> None:
    for i, xi in enumerate(x):
        for j, xj in enumerate(x):
            m[i][j] += w * xi * xj


def solve(m: list[list[float]], v: list[float]) -> list[float] | None:
    """x with m x = v, m symmetric positive definite (Gaussian elimination; such matrices need
    no pivoting); None when singular (a pivot below 1e-12 of the largest diagonal entry)."""
    n = len(v)
    a, b = [list(row) for row in m], list(v)
    eps = 1e-12 * (max(abs(a[i][i]) for i in range(n)) or 1.0)
    for k in range(n):
        pivot_row, pivot = a[k], a[k][k]
        if pivot <= eps:
            return None
        for r in range(k + 1, n):
            row = a[r]
            if f := row[k] / pivot:
                for c in range(k + 1, n):
                    row[c] -= f * pivot_row[c]
                b[r] -= f * b[k]
    x = [0.0] * n
    for i in range(n - 1, -1, -1):
        row, s = a[i], b[i]
        for c in range(i + 1, n):
            s -= row[c] * x[c]
        x[i] = s / row[i]
    return x


@cache
def _subsets(n: int) -> tuple[tuple[int, ...], ...]:
    """Every non-empty subset of range(n), largest first."""
    return tuple(c for k in range(n, 0, -1) for c in combinations(range(n), k))


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
    n, tol = len(v), 1e-9 * max(map(abs, v))
    best, best_f = [0.0] * n, 0.0
    for free in (first, *_subsets(n)) if first else _subsets(n):
        if len(free) == n:
            x = solve(m, v)
        else:
            x = solve([[m[i][j] for j in free] for i in free], [v[i] for i in free])
        if x is None or min(x) < 0:
            continue
        theta = [0.0] * n
        for i, xi in zip(free, x, strict=True):
            theta[i] = xi
        held = [i for i in range(n) if i not in free]
        if all(sum(map(mul, m[i], theta)) - v[i] >= -tol for i in held):
            return theta, free
        f = -sum(v[i] * xi for i, xi in zip(free, x, strict=True))  # objective at m x = v
        if f < best_f:
            best_f, best = f, theta
    return best, None
