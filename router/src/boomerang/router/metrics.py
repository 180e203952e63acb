"""The router's Prometheus metrics, one registry per app (no module globals).

Names other components read (keep them stable): `boomerang_router_reuse_total{outcome}` with
outcome in hit, partial, miss, expired, rejected, fallback, cached;
`boomerang_router_requests_total
{outcome}`; `boomerang_router_ttft_seconds{reuse}` (the turn's reuse outcome, so that TTFT
with and without reuse can be compared); `boomerang_router_reused_tokens_total{outcome}`;
`boomerang_router_reused_fraction`. Each chat/completion request counts exactly one reuse
outcome:
- hit: a verified handle was attached whole (the prompt extends all D holds), P accepted it;
- partial: D's handle narrowed to the whole blocks of the common prefix was attached (the
  history diverged after them), P accepted it;
- miss: no handle was stored for the conversation (first turn, unknown conversation);
- expired: a handle existed but was past the router's TTL;
- rejected: a handle existed but nothing of it is usable (no whole block of the common prefix,
  fewer shared tokens than the recompute threshold, or D's block size unknown);
- fallback: a handle existed and verified (or could not be verified) but the turn was computed
  without it (tokenize failed, P failed after receiving it, its decode pod is gone, P is not
  bidirectional);
- cached (adaptive mode): the handle verified, but its lease had been released (D no longer
  pinned the blocks), and the turn was continued on that decoder, whose prefix cache serves
  what it still holds of the history (D computes the rest: evicted blocks cost time, never
  correctness).
Hit and partial turns add the tokens P may pull from D to `reused_tokens_total`; partial turns
observe reused tokens / prompt tokens in `reused_fraction`.

Hardening: a request refused at the in-flight limit (429) counts `requests_total{outcome=
overloaded}` and no reuse outcome (it never reached the flow); `inflight_requests` is the
number being served; `api_key_reloads_total{result=ok|error}` counts re-reads of a changed API
keys file (error: the update was unreadable or empty and the last good keys were kept).

Degraded turns: `degraded_turns_total{missing=prefill|decode}` counts turns sent to one engine
alone because the other role had none (`degraded.py`). They still count one reuse outcome:
fallback when a usable handle was found (it goes back to the store unused), else miss,
expired or rejected as usual; never hit or partial.

Paths (issue 12): `path_total{path=pull|recompute|continue}` counts every turn by how its
prompt was served: pull (P was given D's handle and took it), continue (the decoder that held
the history answered the turn from its own cache, no P), recompute (everything else: P or one
engine alone computed the whole prompt). In `static` mode every turn is pull or recompute,
exactly as the reuse outcomes say. A verified handle the cost model chose not to use (recompute)
counts reuse outcome fallback; a continued turn counts the outcome its handle verified with
(hit or partial) and its reused tokens. `cost_coefficient{name}` are the cost model's learned
coefficients, `break_even_tokens` the history length above which pull beats recompute (within
the tuning bounds, the engine's recompute threshold as a floor);
`tuning_reloads_total{result=ok|error}` counts re-reads of a changed config file (error: its
`tuning` section was invalid and the last good one was kept). Retention (`leases.py`):
`retention_seconds`, `retained_blocks`, `leases_released_total{reason}` (superseded, expired,
ended, recompute, budget), `lease_errors_total{op}`, `leases_renewed_total`. Clients' hints
(`hints.py`): `retention_hint_seconds` (as asked), `retention_hints_capped_total`, and
`lease_retention_seconds{source=hint|learned}` (what each lease was filed with).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REUSE_OUTCOMES = ("hit", "partial", "miss", "expired", "rejected", "fallback", "cached")
PATHS = ("pull", "recompute", "continue")
RELEASE_REASONS = ("superseded", "expired", "ended", "recompute", "budget")
RETENTION_SOURCES = ("hint", "learned")
_RETENTION_BUCKETS = (10, 30, 60, 120, 300, 600, 1800, 3600, 86400)
_FRACTION_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)
_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
)


class Metrics:
    """Every counter and histogram the router exports."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        p = "boomerang_router_"
        self.requests = Counter(
            p + "requests", "Client requests by outcome.", ["outcome"], registry=r
        )
        self.turns = Counter(
            p + "turns",
            "Turns by what the client got: served (a whole answer), broken (a stream ended by "
            "an in-band error), failed (an error answer) or cancelled (the client left).",
            ["outcome"],
            registry=r,
        )
        self.reuse = Counter(
            p + "reuse", "Reuse decision per turn (see module docs).", ["outcome"], registry=r
        )
        self.ttft = Histogram(
            p + "ttft_seconds",
            "Router-measured time from request arrival to the first generated byte sent, by the "
            "turn's reuse outcome.",
            ["reuse"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.prefill_latency = Histogram(
            p + "prefill_seconds", "Prefill call latency.", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.decode_latency = Histogram(
            p + "decode_seconds", "Decode call latency.", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.tokenize_latency = Histogram(
            p + "tokenize_seconds",
            "Tokenize call latency (reuse verification).",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.handles_stored = Counter(p + "handles_stored", "Handles filed.", registry=r)
        self.handles_skipped = Counter(
            p + "handles_skipped",
            "Turns whose decode result could not be filed as a handle, by reason.",
            ["reason"],
            registry=r,
        )
        self.store_errors = Counter(
            p + "store_errors", "Conversation store errors.", ["op"], registry=r
        )
        self.stored_conversations = Gauge(
            p + "stored_conversations", "Handles held (memory store only).", registry=r
        )
        self.upstream_failures = Counter(
            p + "upstream_failures", "Failed engine calls.", ["role", "kind"], registry=r
        )
        self.retries = Counter(p + "retries", "Engine calls retried.", ["role"], registry=r)
        self.ejections = Counter(p + "ejections", "Engines ejected.", ["role"], registry=r)
        self.request_caused = Counter(
            p + "request_caused_failures",
            "Engine 5xx answers no engine of the role avoided for the same call: the "
            "request's doing, not counted towards ejecting any engine.",
            ["role"],
            registry=r,
        )
        self.failed_pulls = Counter(
            p + "failed_pulls",
            "Turns whose P, by its own count of cached prompt tokens, did not take what it was "
            "sent to pull from D and recomputed it (counted as reuse outcome fallback).",
            registry=r,
        )
        self.carried_over = Counter(
            p + "streams_carried_over",
            "Streams whose engine died after the first byte: carried over to another engine "
            "(carried), or ended with an error event because no engine took it (failed). A "
            "stream that cannot be carried (`migration.py`) is not counted.",
            ["outcome"],
            registry=r,
        )
        self.endpoints = Gauge(
            p + "endpoints", "Known engines by role and state.", ["role", "state"], registry=r
        )
        self.prompt_mismatch = Counter(
            p + "verification_prompt_mismatch",
            "Turns where P's prompt ids differed from the tokenized ones (template drift).",
            registry=r,
        )
        self.reused_tokens = Counter(
            p + "reused_tokens",
            "Prompt tokens P was offered from D's retained blocks, by reuse outcome.",
            ["outcome"],
            registry=r,
        )
        self.reused_fraction = Histogram(
            p + "reused_fraction",
            "Partial reuse: reused tokens / prompt tokens of the turn.",
            buckets=_FRACTION_BUCKETS,
            registry=r,
        )
        self.handles_without_blocks = Counter(
            p + "handles_without_blocks",
            "Handles filed without per-block hashes (full hits only, no partial), by reason.",
            ["reason"],
            registry=r,
        )
        self.inflight = Gauge(
            p + "inflight_requests",
            "Completion requests being served by this replica (see max_inflight).",
            registry=r,
        )
        self.api_key_reloads = Counter(
            p + "api_key_reloads",
            "Re-reads of a changed API keys file: ok, or error (the last good keys were kept).",
            ["result"],
            registry=r,
        )
        self.degraded_turns = Counter(
            p + "degraded_turns",
            "Turns served by one engine alone as a plain request, by the role that had no "
            "engine (see single_engine_fallback).",
            ["missing"],
            registry=r,
        )
        self._paths(r, p)
        for outcome in REUSE_OUTCOMES:
            self.reuse.labels(outcome)
        self.requests.labels("overloaded")
        for result in ("ok", "error"):
            self.api_key_reloads.labels(result)
        for outcome in ("hit", "partial"):
            self.reused_tokens.labels(outcome)
        for role in ("prefill", "decode"):
            self.degraded_turns.labels(role)

    def _paths(self, r: CollectorRegistry, p: str) -> None:
        """Path choice, the cost model, tuning reloads and retention (issue 12)."""
        self.path = Counter(p + "path", "Turns by the path that served them.", ["path"], registry=r)
        self.cost_coefficient = Gauge(
            p + "cost_coefficient", "The cost model's learned coefficients.", ["name"], registry=r
        )
        self.break_even_tokens = Gauge(
            p + "break_even_tokens",
            "History tokens above which pulling from D beats recomputing on P (bounded).",
            registry=r,
        )
        self.tuning_reloads = Counter(
            p + "tuning_reloads",
            "Re-reads of a changed config file's tuning: ok, or error (the last one was kept).",
            ["result"],
            registry=r,
        )
        self.retention_seconds = Gauge(
            p + "retention_seconds", "How long a handle is kept now (learned).", registry=r
        )
        self.retained_blocks = Gauge(
            p + "retained_blocks", "D's KV blocks held by stored handles.", registry=r
        )
        self.leases_released = Counter(
            p + "leases_released", "D leases released early, by reason.", ["reason"], registry=r
        )
        self.lease_errors = Counter(
            p + "lease_errors", "Failed lease API calls to D, by operation.", ["op"], registry=r
        )
        self.leases_renewed = Counter(p + "leases_renewed", "D leases renewed.", registry=r)
        self._hints(r, p)
        self.kv_events = Counter(
            p + "kv_events",
            "Engine KV cache events applied to the index, by type.",
            ["type"],
            registry=r,
        )
        self.kv_event_gaps = Counter(
            p + "kv_event_gaps", "Event batches missed and asked for again.", registry=r
        )
        self.kv_index_resyncs = Counter(
            p + "kv_index_resyncs",
            "Times an engine's entries were dropped and rebuilt (restart, lost events).",
            registry=r,
        )
        self.kv_index_blocks = Gauge(p + "kv_index_blocks", "Blocks in the KV index.", registry=r)
        self.kv_index_bytes = Gauge(
            p + "kv_index_bytes", "Memory the KV index's tables take.", registry=r
        )
        self.kv_index_usable = Gauge(
            p + "kv_index_usable",
            "1 while the engines hash blocks as the router does (the index is used), else 0.",
            registry=r,
        )
        self.kv_index_usable.set(1)
        self.claims = Counter(
            p + "claims",
            "Claims of D's leases before offering them to P, by answer (unneeded: D's leases "
            "never yield; held: offered; gone, failed: not offered).",
            ["result"],
            registry=r,
        )
        for claim in ("unneeded", "held", "gone", "failed"):
            self.claims.labels(claim)
        for path in PATHS:
            self.path.labels(path)
        for result in ("ok", "error"):
            self.tuning_reloads.labels(result)
        for reason in RELEASE_REASONS:
            self.leases_released.labels(reason)

    def _hints(self, r: CollectorRegistry, p: str) -> None:
        """Clients' retention hints and what each lease got (issue 35)."""
        self.retention_hint = Histogram(
            p + "retention_hint_seconds",
            "Retention asked by a client's hint (cache_control ttl, prompt_cache_retention).",
            buckets=_RETENTION_BUCKETS,
            registry=r,
        )
        self.retention_hints_capped = Counter(
            p + "retention_hints_capped",
            "Clients' retention hints above tuning.retention_max_client_s (capped).",
            registry=r,
        )
        self.lease_retention = Histogram(
            p + "lease_retention_seconds",
            "Retention each lease was filed with, by where it came from (hint or learned).",
            ["source"],
            buckets=_RETENTION_BUCKETS,
            registry=r,
        )
        for source in RETENTION_SOURCES:
            self.lease_retention.labels(source)
