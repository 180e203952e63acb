"""Conversations recorded elsewhere, as the simulator replays them (pure).

Why: a planner is only as good as its workload, and an operator's own traffic is the workload
that matters. Two sources:

- **the router's own per-turn log** (`log_json: true`): each `Served turn` line carries the
  digests of the keys its conversation was looked up and filed under, its prompt and
  completion tokens, the time it was logged (its end) and how long it took, so a
  conversation's turns, their order and the think time between an answer and the next turn
  are all in it. A turn without a token count (its prompt was never tokenized) cannot be
  replayed: it is left out, and the count is reported.
- **OpenAI-format conversations** (a JSON list; each item a list of messages, or an object
  with `messages`): every assistant message is a turn's answer, the messages before it its
  prompt. Token counts are estimated at four characters a token (no tokenizer is assumed), and
  there are no times: sessions arrive at a given rate, each turn right after the previous.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from boomsim.workload import Turns

CHARS_PER_TOKEN = 4
"""The usual estimate for English text under BPE tokenizers (an estimate, stated as such)."""


@dataclass
class Trace:
    """Sessions to replay: (arrival offset in seconds, turns), first arrival at 0."""

    sessions: list[tuple[float, Turns]]
    dropped_turns: int = 0
    """Turns the source had but could not be replayed (no token count)."""
    notes: list[str] = field(default_factory=list)

    @property
    def turns(self) -> int:
        return sum(len(t) for _, t in self.sessions)


def from_router_log(lines: Iterable[str]) -> Trace:
    """The `Served turn` lines of the router's JSON log, chained into conversations: a turn
    continues the conversation whose last turn filed what it looks up (`conversation`, the
    digest of its lookup key, against the previous turn's `next`, the digest of the key it
    filed under: equal for a conversation id or a session, a chain of history fingerprints
    otherwise). A turn that looked nothing up, or found no turn that filed it, starts one."""
    recs = []
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("msg") == "Served turn" and "ts" in rec:
            recs.append(rec)
    recs.sort(key=_start)
    convs: list[list[dict[str, Any]]] = []
    waiting: dict[str, int] = {}  # a filed key's digest -> the conversation that filed it
    for rec in recs:
        looked = rec.get("conversation")
        index = waiting.pop(looked, None) if looked else None
        if index is None:
            index = len(convs)
            convs.append([])
        convs[index].append(rec)
        if filed := rec.get("next"):
            waiting[filed] = index
    sessions: list[tuple[float, Turns]] = []
    dropped = 0
    for chain in convs:
        turns: Turns = []
        first_start, last_end = 0.0, 0.0
        for rec in chain:
            prompt, answer = rec.get("prompt_tokens"), rec.get("completion_tokens")
            if not prompt or not answer:  # never tokenized: its turn cannot be replayed
                dropped += 1
                continue
            if not turns:
                first_start = _start(rec)
            think = max(0.0, _start(rec) - last_end) if turns else 0.0
            turns.append((int(prompt), int(answer), think))
            last_end = float(rec["ts"])
        if turns:
            sessions.append((first_start, turns))
    return _from_zero(sessions, dropped)


def _start(rec: dict[str, Any]) -> float:
    """When a logged turn began: the line is written at its end, `seconds` after its start."""
    return float(rec["ts"]) - float(rec.get("seconds") or 0.0)


def from_conversations(data: Sequence[Any], rate_per_s: float) -> Trace:
    """OpenAI-format conversations, arriving `rate_per_s` a second in file order."""
    if rate_per_s <= 0:
        raise ValueError("the arrival rate of conversations must be positive")
    sessions: list[tuple[float, Turns]] = []
    for i, item in enumerate(data):
        messages = item.get("messages") if isinstance(item, dict) else item
        if not isinstance(messages, list):
            raise ValueError(f"conversation {i}: a list of messages, or an object with one")
        turns: Turns = []
        context = 0
        for m in messages:
            tokens = _tokens(m)
            if isinstance(m, dict) and m.get("role") == "assistant" and context:
                turns.append((context, max(1, tokens), 0.0))
            context += tokens
        if turns:
            sessions.append((i / rate_per_s, turns))
    return Trace(sessions, notes=[f"tokens estimated at {CHARS_PER_TOKEN} characters a token"])


def _tokens(message: Any) -> int:
    if not isinstance(message, dict):
        raise ValueError(f"a message is an object with role and content, not {message!r}")
    content = message.get("content") or ""
    if isinstance(content, list):  # content parts: their text
        content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    extra = json.dumps(message.get("tool_calls")) if message.get("tool_calls") else ""
    return max(1, round((len(str(content)) + len(extra)) / CHARS_PER_TOKEN))


def _from_zero(sessions: list[tuple[float, Turns]], dropped: int) -> Trace:
    if not sessions:
        return Trace([], dropped)
    t0 = min(t for t, _ in sessions)
    return Trace(sorted(((t - t0, turns) for t, turns in sessions), key=lambda s: s[0]), dropped)
