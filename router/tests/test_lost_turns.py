"""A turn is served only when the client got a whole answer: vLLM reports a failure in-band
under its 200 (an error event then [DONE]), so an error before D's first token is retried on
another engine before the client gets a byte (never an empty 200), one after it ends the
stream with the error, and only a whole answer is logged and counted as served."""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

import pytest
from router_testing import chat, post, stream


def turn_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    names = ("Served turn", "Failed turn", "Cancelled turn")
    return [r for r in caplog.records if r.getMessage() in names]


async def test_an_in_band_error_before_the_first_token_is_served_by_another_decoder(
    world: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="boomerang.router")
    w = await world(n_decode=2, decode_spec=[{"in_band_errors": 1}, {}])
    events = await stream(w, {**chat([{"role": "user", "content": "hello"}]), "stream": True})
    text = "".join(
        e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices")
    )
    assert text and not any("error" in e for e in events)  # one whole answer, no error
    assert sum(d.in_band_errors for d in w.decode) == 0  # D0 failed, D1 served
    assert await w.metric("boomerang_router_retries_total", role="decode") == 1
    (line,) = turn_lines(caplog)
    assert line.getMessage() == "Served turn" and line.finish_reason == "stop"  # type: ignore[attr-defined]
    assert line.completion_tokens > 0  # type: ignore[attr-defined]
    assert await w.metric("boomerang_router_turns_total", outcome="served") == 1


async def test_no_decoder_left_is_an_error_answer_not_an_empty_200(
    world: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="boomerang.router")
    w = await world(single_engine_fallback=False, decode_spec={"in_band_errors": 5})
    status, body = await post(w, {**chat([{"role": "user", "content": "x"}]), "stream": True})
    assert status == 502 and "decode" in body["error"]["message"]
    (line,) = turn_lines(caplog)
    assert line.getMessage() == "Failed turn" and line.outcome == "failed"  # type: ignore[attr-defined]
    assert "502" in line.error  # type: ignore[attr-defined]
    assert await w.metric("boomerang_router_turns_total", outcome="failed") == 1
    assert await w.metric("boomerang_router_path_total", path="recompute") == 0


async def test_a_stream_broken_after_its_first_token_is_not_a_served_turn(
    world: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="boomerang.router")
    # not carried over to another engine (`test_carry_over.py`): the failure reaches the client
    w = await world(decode_spec={"in_band_errors": 1, "in_band_after": 1}, migrate_streams=False)
    events = await stream(w, {**chat([{"role": "user", "content": "x"}]), "stream": True})
    assert "error" in events[-1]  # the client sees the failure in its stream
    (line,) = turn_lines(caplog)
    assert line.getMessage() == "Failed turn" and line.outcome == "broken"  # type: ignore[attr-defined]
    assert await w.metric("boomerang_router_turns_total", outcome="broken") == 1
    assert (
        await w.metric("boomerang_router_upstream_failures_total", role="decode", kind="protocol")
        == 1
    )


async def test_a_turn_s_log_line_names_its_conversation_by_the_keys_it_looked_and_filed(
    world: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The planner's trace (`boomsim.trace`): a fingerprinted turn is looked up under its
    history and filed under the next one's, so each line's `conversation` is the previous
    line's `next`; digests, never the key (it holds the tenant)."""
    caplog.set_level(logging.INFO, logger="boomerang.router")
    w = await world()
    messages = [{"role": "user", "content": "hello there"}]
    for _ in range(3):
        status, answer = await post(w, chat(messages))
        assert status == 200
        messages += [answer["choices"][0]["message"], {"role": "user", "content": "and then?"}]
    for _ in range(100):  # a turn is logged once its answer went out
        if len(turn_lines(caplog)) == 3:
            break
        await asyncio.sleep(0.02)
    lines = [vars(r) for r in turn_lines(caplog)]
    assert len(lines) == 3
    for before, after in itertools.pairwise(lines):
        assert after["conversation"] == before["next"] is not None
    assert all(len(line["next"]) == 16 for line in lines)
    assert all(line["prompt_tokens"] for line in lines)
