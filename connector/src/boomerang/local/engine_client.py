"""Plain HTTP calls to one vLLM engine: what the local runtime itself sends an engine.

Calibration times prefills on P and the demo reads each engine's token-source counters; both
talk to an engine directly, with no router in between. Prometheus pages (an engine's, the
router's) are read with prometheus_client's own parser, here, for the demo, the benchmarks and
the tests alike. The benchmarks' reference P/D client (`pdclient.py`, beside this module)
builds its turns from these same calls. A decoder's lease API is read and told to yield here
too, so the benchmarks and the data-plane tests start a run on a decoder that retains nothing,
the same way.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from boomerang.facts.engine import LEASE_PATH

BY_SOURCE = "vllm:prompt_tokens_by_source"
"""vLLM's counter of prompt tokens by where they came from (its samples end in `_total`)."""


def post(url: str, body: dict[str, Any], timeout: float = 300.0) -> dict[str, Any]:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        data: dict[str, Any] = json.loads(resp.read())
    return data


def stream_events(
    url: str, body: dict[str, Any], timeout: float = 300.0, headers: dict[str, str] | None = None
) -> Any:
    """Yield (arrival time, JSON) per SSE data event (`headers` added to the request's)."""
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json", **(headers or {})}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                yield time.perf_counter(), json.loads(line[6:])


def completion_body(model: str, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    """A greedy token-id completion that returns ids and logprobs, so turns compare exactly."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "logprobs": 1,
        "return_token_ids": True,
        "ignore_eos": True,
    }


def scrape(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        return str(resp.read().decode())


def samples(metrics_text: str, name: str) -> list[Sample]:
    """Every sample called `name` on a Prometheus page, however its family is typed (a
    counter's samples end in `_total`, a histogram's in `_sum`, `_count` and `_bucket`)."""
    return [
        sample
        for family in text_string_to_metric_families(metrics_text)
        for sample in family.samples
        if sample.name == name
    ]


def totals(metrics_text: str, name: str, label: str) -> dict[str, float]:
    """The samples called `name`, summed by the value of one of their labels."""
    found: dict[str, float] = {}
    for sample in samples(metrics_text, name):
        key = sample.labels.get(label)
        if key:
            found[key] = found.get(key, 0.0) + sample.value
    return found


def tokens_by_source(metrics_text: str) -> dict[str, float]:
    """An engine's `prompt_tokens_by_source` totals: `external_kv_transfer` (pulled from the
    other engine), `local_compute`, `local_cache_hit`."""
    return totals(metrics_text, f"{BY_SOURCE}_total", "source")


def _lease_request(url: str, token: str, op: str, body: Any) -> urllib.request.Request:
    """GET the lease API's state without `op`, else POST `op` with `body` (`{}` if None)."""
    data = None if not op else json.dumps({} if body is None else body).encode()
    return urllib.request.Request(
        f"{url}{LEASE_PATH}{'/' + op if op else ''}",
        data,
        {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )


def lease_call(url: str, token: str, op: str = "", body: Any = None) -> dict[str, Any]:
    """One call to an engine's lease API: its state (no `op`), or POST `op` with `body`; an
    error status raises (urllib's HTTPError, an OSError)."""
    with urllib.request.urlopen(_lease_request(url, token, op, body), timeout=30) as resp:
        answer: dict[str, Any] = json.loads(resp.read())
    return answer


def lease_status(
    url: str, token: str, op: str = "", body: Any = None
) -> tuple[int, dict[str, Any]]:
    """`lease_call`'s status and JSON answer, an error's included (for tests of refusals)."""
    try:
        with urllib.request.urlopen(_lease_request(url, token, op, body), timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def retained_blocks(decoders: Iterable[str], token: str) -> float:
    """The KV blocks the decoders retain for later turns, in all (one not answering: 0)."""
    total = 0.0
    for d in decoders:
        with contextlib.suppress(OSError, ValueError):
            total += lease_call(d, token).get("retained", {}).get("retained_blocks", 0)
    return total


def release_retained(decoders: Iterable[str], token: str, timeout_s: float = 60.0) -> float:
    """Tell every decoder to yield what it retains, again each half second (a lease a router
    had claimed yields once its claim lapses), until none retains a block or `timeout_s`
    passed; what they still retain then."""
    decoders = list(decoders)
    deadline = time.monotonic() + timeout_s
    while True:
        for d in decoders:
            with contextlib.suppress(OSError, ValueError):
                lease_call(d, token, "yield")
        left = retained_blocks(decoders, token)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)
