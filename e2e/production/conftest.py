"""Real CPU engines set up as production runs them (P's prefix cache on, KV events on), one
engine set per test module, started from a manifest by the production benchmark's own
helpers (`bench.production.run.engines`, `bench.production.run.router`: what `boomerang up` places).

Skips only when the engine venv is absent and `CI` is unset; under CI a missing venv fails.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from production.stacks import venv


@pytest.fixture(scope="module")
def stack_of() -> Iterator[Any]:
    """`stack_of(dd)`: the engines of `dd`, running until the module's tests are done."""
    from bench.production import run as bench_production

    opened: list[Any] = []

    def start(dd: Any) -> Any:
        cm = bench_production.engines(dd, venv(), log=lambda _m: None)
        es = cm.__enter__()
        opened.append(cm)
        return es

    yield start
    for cm in reversed(opened):
        cm.__exit__(None, None, None)
