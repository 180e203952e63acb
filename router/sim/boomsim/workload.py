"""Who sends turns, and when: vLLM's multi-turn client shape, the published sweep, agents.

Why re-implemented: the simulator must run without vLLM's benchmark and without text, so the
shapes are drawn from their documented parameters with a seeded generator (the same seed gives
the same conversations), and only token counts are kept.

- `multi_turn`: vLLM's `benchmarks/multi_turn` synthetic generator as the fair benchmark
  configures it (`e2e/bench/production/run.py`): 4-6 user turns, a first prompt of
  1.5-3k tokens, user turns of 20-200, answers of 32-96, all uniform; `clients` closed-loop
  clients with at most `max_active` conversations open, each client sending the next turn of
  the next open conversation as soon as its previous turn is answered.
- `published`: the seeds' sweep (their `run_multiturn_sweep.sh`): a constant prefix, 10 turns
  of 150 user and 300 answer tokens, 10 conversations, 2 clients.
- `agentic`: sessions arriving as a Poisson process; a long system prompt (4-16k), a first
  user message (100-500), 4-16 turns whose suffixes are tool results (0.5-8k, log-uniform),
  answers of 32-512 (tool calls), and a think time of 1-30 s (uniform) between an answer and
  the next turn.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from boomsim.loop import Loop

Turns = list[tuple[int, int, float]]
"""(prompt tokens, answer tokens, think seconds before the turn) per turn."""
Send = Callable[[int, int, int, int, Callable[[float], None]], None]
"""(conversation, turn index, prompt, answer, done) -> None: the cluster's `turn`."""


@dataclass(frozen=True)
class Shape:
    """A conversation generator's parameters (inclusive uniform ranges)."""

    turns: tuple[int, int] = (4, 6)
    first: tuple[int, int] = (1500, 3000)
    user: tuple[int, int] = (20, 200)
    answer: tuple[int, int] = (32, 96)
    log_user: bool = False
    """Draw user turns log-uniformly (tool results)."""
    think_s: tuple[float, float] = (0.0, 0.0)
    max_len: int = 32_768
    """The engines' max model length (the published runs' `--max-model-len`): a conversation
    ends before the turn whose prompt and answer would exceed it, as a client must."""


MULTI_TURN = Shape()
AGENTIC = Shape(
    turns=(4, 16),
    first=(4100, 16500),
    user=(500, 8000),
    answer=(32, 512),
    log_user=True,
    think_s=(1.0, 30.0),
)


def conversation(rng: random.Random, shape: Shape) -> Turns:
    """One conversation's turns: each prompt extends the previous prompt and answer."""
    out: Turns = []
    prompt = rng.randint(*shape.first)
    for k in range(rng.randint(*shape.turns)):
        if k:
            lo, hi = shape.user
            user = (
                round(math.exp(rng.uniform(math.log(lo), math.log(hi))))
                if shape.log_user
                else rng.randint(lo, hi)
            )
            prompt += out[-1][1] + user
        think = rng.uniform(*shape.think_s) if k else 0.0
        answer = rng.randint(*shape.answer)
        if prompt + answer > shape.max_len:
            break
        out.append((prompt, answer, think))
    return out


def published(prefix: int, turns: int = 10, user: int = 150, answer: int = 300) -> Turns:
    """One conversation of the seeds' sweep at `prefix` tokens."""
    return [(prefix + user + k * (user + answer), answer, 0.0) for k in range(turns)]


class ClosedLoop:
    """`clients` clients over a stream of conversations, at most `max_active` open."""

    def __init__(
        self, loop: Loop, send: Send, convs: Iterator[Turns], clients: int, max_active: int
    ) -> None:
        self.loop, self.send, self.convs = loop, send, convs
        self.clients, self.max_active = clients, max_active
        self.open: deque[tuple[int, Turns, int]] = deque()
        self.idle = 0
        self.serial = 0
        self.opened = 0

    def start(self) -> None:
        for _ in range(self.max_active):
            self._open()
        self.idle = self.clients
        for _ in range(self.clients):
            self._wake()

    def _open(self) -> None:
        turns = next(self.convs, None)
        if turns is not None:
            self.opened += 1
            self.open.append((self.opened, turns, 0))

    def _wake(self) -> None:
        if self.idle <= 0 or not self.open:
            return
        self.idle -= 1
        conv, turns, k = self.open.popleft()
        prompt, answer, _ = turns[k]

        def done(_: float) -> None:
            if k + 1 < len(turns):
                self.open.append((conv, turns, k + 1))
            else:
                self._open()
            self.idle += 1
            self._wake()
            self._wake()  # a reopened conversation may wake a client left idle

        self.send(conv, k, prompt, answer, done)


class OpenLoop:
    """Sessions arriving at `rate` per second, each turn after its think time. The gaps between
    arrivals are exponential (Poisson arrivals, `burst_cv` 1), or gamma-distributed with that
    coefficient of variation: above 1, sessions come in bursts with quiet spells between."""

    def __init__(
        self,
        loop: Loop,
        send: Send,
        convs: Iterator[Turns],
        rate: float,
        rng: random.Random,
        burst_cv: float = 1.0,
    ) -> None:
        self.loop, self.send, self.convs, self.rate, self.rng = loop, send, convs, rate, rng
        self.shape = 1.0 / burst_cv**2
        self.opened = 0

    def _gap(self) -> float:
        if self.shape == 1.0:
            return self.rng.expovariate(self.rate)
        return self.rng.gammavariate(self.shape, 1.0 / (self.rate * self.shape))

    def start(self) -> None:
        self.loop.at(self.loop.now, self._arrive)

    def _arrive(self, _: object = None) -> None:
        turns = next(self.convs, None)
        if turns is None:
            return
        self.opened += 1
        session_turn(self.loop, self.send, self.opened, turns, 0)
        self.loop.at(self.loop.now + self._gap(), self._arrive)


def session_turn(loop: Loop, send: Send, conv: int, turns: Turns, k: int) -> None:
    """Send turn `k` of a session; its next one goes its think time after this one's answer
    (an open-loop session: nobody waits for a free client)."""
    prompt, answer, _ = turns[k]

    def done(t: float) -> None:
        if k + 1 < len(turns):
            think = turns[k + 1][2]
            loop.at(t + think, lambda _: session_turn(loop, send, conv, turns, k + 1))

    send(conv, k, prompt, answer, done)


class Replay:
    """Recorded sessions (`trace.Trace`): each arrives at its offset, each turn its think
    time after the previous turn's answer."""

    def __init__(self, loop: Loop, send: Send, sessions: list[tuple[float, Turns]]) -> None:
        self.loop, self.send, self.sessions = loop, send, sessions

    def start(self) -> None:
        for conv, (at, turns) in enumerate(self.sessions, 1):
            self.loop.at(self.loop.now + at, self._first, (conv, turns))

    def _first(self, arg: tuple[int, Turns]) -> None:
        session_turn(self.loop, self.send, arg[0], arg[1], 0)


def stream(shape: Shape, n: int, seed: int) -> Iterator[Turns]:
    """`n` conversations of `shape`, drawn lazily from one seeded generator (a conversation
    whose first prompt alone exceeds `max_len` is drawn again)."""
    rng = random.Random(seed)
    made = 0
    while made < n:
        turns = conversation(rng, shape)
        if turns:
            made += 1
            yield turns
