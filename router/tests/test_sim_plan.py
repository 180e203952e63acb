"""The planner (issue 44 item 7, `boomsim.plan`): a manifest and a recorded workload in, the
sweeps' figures per candidate size and policy out (simulated)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from boomsim import plan
from boomsim.trace import CHARS_PER_TOKEN, from_conversations, from_router_log

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "examples" / "qwen3-32b-adaptive.yaml"


def served(
    conv: str | None,
    end: float,
    seconds: float,
    prompt: int | None,
    answer: int,
    filed: str | None = "same",
) -> str:
    """One `Served turn` line as the router's JSON log writes it (`logs.JsonFormatter`):
    looked up under `conv`, filed under `filed` (by default the same key: an id or a
    session)."""
    record = {"ts": end, "level": "INFO", "logger": "boomerang.router", "msg": "Served turn",
              "conversation": conv, "next": conv if filed == "same" else filed,
              "prompt_tokens": prompt, "completion_tokens": answer, "seconds": seconds,
              "path": "pull"}  # fmt: skip
    return json.dumps(record)


def test_the_router_s_log_becomes_conversations_with_their_think_times() -> None:
    lines = [
        served("a", 100.5, 0.5, 3000, 50),
        '{"ts": 100.6, "msg": "Learned block size"}',
        "not json at all",
        served("b", 103.0, 1.0, 9000, 20),
        served("a", 110.0, 0.4, 3600, 40),  # began 9.1 s after a's first answer
        served("c", 104.0, 0.2, None, 10),  # never tokenized: c cannot be replayed
        served("c", 105.0, 0.2, 500, 10),
    ]
    trace = from_router_log(lines)
    assert trace.sessions == [(0.0, [(3000, 50, 0.0), (3600, 40, pytest.approx(9.1))]),
                              (2.0, [(9000, 20, 0.0)]),
                              (pytest.approx(4.8), [(500, 10, 0.0)])]  # fmt: skip
    assert trace.dropped_turns == 1 and trace.turns == 4


def test_fingerprinted_turns_chain_by_the_key_each_filed() -> None:
    """Without an id or a session, a turn is looked up by its history's fingerprint and
    filed under the next one's: the chain, not one name, makes the conversation."""
    lines = [
        served(None, 10.0, 1.0, 2000, 30, filed="f1"),  # a first turn: nothing to look up
        served(None, 11.0, 1.0, 5000, 30, filed="g1"),  # another conversation's first
        served("f1", 20.0, 0.5, 2100, 30, filed="f2"),
        served("g1", 21.0, 0.5, 5100, 30, filed="g2"),
        served("f2", 30.0, 0.5, 2200, 30, filed="f3"),
        served("zz", 31.0, 0.5, 900, 30, filed="z2"),  # its earlier turns not in this log
    ]
    trace = from_router_log(lines)
    assert [[p for p, _, _ in turns] for _, turns in trace.sessions] == [
        [2000, 2100, 2200],
        [5000, 5100],
        [900],
    ]


def test_openai_conversations_become_turns_at_four_characters_a_token() -> None:
    system = {"role": "system", "content": "x" * 4000}
    convs = [
        [system, {"role": "user", "content": "y" * 400}, {"role": "assistant", "content": "z" * 80},
         {"role": "user", "content": "w" * 40}, {"role": "assistant", "content": "v" * 8}],
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
    ]  # fmt: skip
    trace = from_conversations(convs, rate_per_s=2.0)
    assert CHARS_PER_TOKEN == 4
    assert trace.sessions == [(0.0, [(1100, 20, 0.0), (1130, 2, 0.0)]), (0.5, [(1, 1, 0.0)])]
    with pytest.raises(ValueError, match="positive"):
        from_conversations(convs, rate_per_s=0)
    with pytest.raises(ValueError, match="conversation 0"):
        from_conversations([{"turns": []}], rate_per_s=1)


def test_candidate_sizes_default_around_the_manifest_s_and_parse_as_asked() -> None:
    d = plan.read_manifest(MANIFEST)
    assert (d.prefill, d.decode, d.policy, d.decoder_ttl_s) == (1, 1, "adaptive", 480.0)
    assert plan.sizes(d, []) == [(1, 1), (1, 2), (2, 1)]
    assert plan.sizes(d, ["1P2D", "2P4D", "1P2D"]) == [(1, 2), (2, 4)]
    with pytest.raises(ValueError, match="1P2D"):
        plan.sizes(d, ["2:4"])


def test_a_plan_runs_every_size_and_policy_on_the_trace_and_marks_the_manifest_s(
    tmp_path: Path,
) -> None:
    lines = []
    for c in range(12):
        t = c * 2.0
        for k in range(4):
            t += 5.0
            lines.append(served(f"c{c}", t, 0.3, 4000 + 1500 * k, 100))
    log = tmp_path / "router.log"
    log.write_text("\n".join(lines) + "\n")
    d = plan.read_manifest(MANIFEST)
    trace = plan.read_trace(log, rate_per_s=1.0)
    rows = plan.plan(d, trace, candidates=[(1, 1), (1, 2)], policies=["affinity"])
    assert [(r["size"], r["policy"]) for r in rows] == [
        ("1P1D*", "adaptive"), ("1P1D", "affinity"), ("1P2D", "adaptive"), ("1P2D", "affinity"),
    ]  # fmt: skip
    assert all(r["turns"] == 48 for r in rows)
    assert all(0 < r["follow_p50"] < 5 and r["goodput"] > 0 for r in rows)
    with pytest.raises(ValueError, match="unknown policies"):
        plan.plan(d, trace, policies=["magic"])


def test_the_planner_runs_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from boomsim.__main__ import main

    convs = [[{"role": "user", "content": "q" * 8000}, {"role": "assistant", "content": "a" * 400}]]
    path = tmp_path / "convs.json"
    path.write_text(json.dumps(convs * 4))
    out = tmp_path / "rows.json"
    main(["plan", "--manifest", str(MANIFEST), "--trace", str(path), "--sizes", "1P1D",
          "--profile", "h100", "--json", str(out)])  # fmt: skip
    printed = capsys.readouterr().out
    assert "4 turns in 4 conversations" in printed and "SIMULATED" in printed
    assert "| 1P1D* | adaptive |" in printed
    assert len(json.loads(out.read_text())) == 1 + len(plan.PEERS)
