"""The simulator's published tables are HEAD's (issue 44 item 6): every generated block of
`docs/simulation.md` carries the hash of the decision code that made it (`boomsim.publish`),
and it must be the hash of the code checked in now. When this fails, run `make sim` (a few
minutes) and commit the regenerated tables."""

from __future__ import annotations

from pathlib import Path

import pytest
from boomsim import publish


def test_the_published_tables_were_made_by_head_s_decision_code() -> None:
    found = publish.stamps(publish.DOC.read_text())
    assert len(found) == 4, (
        "docs/simulation.md: the calibration, CPU, sweeps and sensitivity blocks"
    )
    now = publish.decision_hash()
    stale = [commit for commit, code in found if code != now]
    assert not stale, (
        f"docs/simulation.md's tables were made at {stale} by other decision code than HEAD's "
        f"({now}): run `make sim` and commit them"
    )


def test_the_decision_code_follows_the_router_s_imports() -> None:
    modules = publish.decision_modules()
    for name in (
        "boomerang.router.turn.plan",
        "boomerang.router.learning.costmodel",
        "boomsim.cluster",
    ):
        assert name in modules
    assert "boomsim.plot" not in modules  # draws, decides nothing
    assert not any(n.startswith(("aiohttp", "numpy", "pydantic")) for n in modules)


def test_a_rule_changes_the_hash_a_docstring_does_not(tmp_path: Path) -> None:
    base = 'def f(x):\n    """Why."""\n    return x + 1\n'
    code = publish._code
    (tmp_path / "a.py").write_text(base)
    (tmp_path / "b.py").write_text(base.replace("Why.", "Because."))
    (tmp_path / "c.py").write_text(base.replace("x + 1", "x + 2"))
    assert code(tmp_path / "a.py") == code(tmp_path / "b.py")
    assert code(tmp_path / "a.py") != code(tmp_path / "c.py")


def test_blocks_are_replaced_in_place_and_a_missing_one_is_an_error() -> None:
    doc = "intro\n<!-- t:start -->\nold\n<!-- t:end -->\nafter\n"
    mark = publish.stamp("abc1234", "0" * 16)
    out = publish.replace_blocks(doc, {"t": "| new |"}, mark)
    assert out == f"intro\n<!-- t:start -->\n{mark}\n\n| new |\n<!-- t:end -->\nafter\n"
    assert publish.stamps(out) == [("abc1234", "0" * 16)]
    with pytest.raises(ValueError, match="u:start"):
        publish.replace_blocks(doc, {"u": "x"}, mark)
