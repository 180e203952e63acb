"""The router's side of D's lease API: claim, release and renew D's retained blocks.

Why apart from `leases.py`: this is only the HTTP contract of Boomerang's vLLM plugin
(`boomerang.connector.plugin.leases`, on D's own port under `/boomerang/v1/leases`) and what each of
its failures means; `leases.py` decides when to call it. Calls carry the router's lease token
as a bearer token (`lease_token_file`, re-read when it changes, else env
`BOOMERANG_LEASE_TOKEN`) on their own keep-alive client (`EngineClient`, made again when the
token changes): the engine client of the turns carries the engines' API key instead. A
failure says whether D may have acted (`maybe_done`: it failed after the request was sent,
so a handle taken out for it must not be offered again) and whether D offers no control at
all (`no_control`: no plugin, 401, 403, an unsupported vLLM, or no token here).

A claim (`claim`) asks D which of a turn's leases it still holds and makes D keep them through
memory pressure (`boomerang.connector.plugin.retained`): on a decoder whose leases may yield to live
work, only a lease D confirmed may be offered to P.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from boomerang.facts.engine import LEASE_PATH, LEASE_TOKEN_ENV
from boomerang.router.config import RouterConfig
from boomerang.router.engines.upstream import (
    EngineClient,
    UpstreamError,
    check_status,
    parse_object,
)
from boomerang.router.engines.upstream import timeout as limits

log = logging.getLogger("boomerang.router")


class LeaseFailure(Exception):
    """A lease call that did not do what was asked, or may have without saying so."""

    def __init__(self, message: str, *, maybe_done: bool, no_control: bool) -> None:
        super().__init__(message)
        self.maybe_done = maybe_done
        """D may have acted on it (it failed after the request was sent)."""
        self.no_control = no_control
        """D offers no lease control: no plugin, refused token, unsupported vLLM."""


@dataclass(frozen=True)
class Renewal:
    """D's answer to a renewal: new deadlines (D's perf_counter clock) and its ceiling."""

    renewed: dict[str, float]
    unknown: list[str]
    ceiling_s: float


class LeaseClient:
    """Release and renew calls to D's lease API, authenticated with the router's lease token
    (`lease_token_file`, re-read when it changes, else env `BOOMERANG_LEASE_TOKEN`)."""

    def __init__(self, config: RouterConfig, env: Mapping[str, str] | None = None) -> None:
        self._config = config
        self._env = os.environ if env is None else env
        self._file_seen: tuple[int, int, int] | None = None
        self._file_token: str | None = None
        self._http: EngineClient | None = None
        self._http_token: str | None = None

    def token(self) -> str | None:
        """The current lease token (None: the router has none, so it has no control)."""
        path = self._config.lease_token_file
        if path is None:
            return self._env.get(LEASE_TOKEN_ENV, "").strip() or None
        try:
            st = os.stat(path)
            seen = (st.st_ino, st.st_mtime_ns, st.st_size)
            if seen != self._file_seen:
                self._file_token = path.read_text().strip() or None
                self._file_seen = seen
        except (OSError, UnicodeDecodeError) as exc:
            log.warning("Cannot read lease token file", extra={"error": repr(exc)})
        return self._file_token

    async def _client(self) -> EngineClient:
        token = self.token()
        if token is None:
            raise LeaseFailure("the router has no lease token", maybe_done=False, no_control=True)
        if self._http is None or token != self._http_token:
            if self._http is not None:
                await self._http.close()
            self._http = EngineClient({"Authorization": f"Bearer {token}"})
            self._http_token = token
        return self._http

    async def _call(self, url: str, op: str, body: dict[str, Any]) -> dict[str, Any]:
        client = await self._client()
        t = self._config.timeouts
        limit = limits(t.probe_s, t.connect_s)
        try:
            path = f"{url}{LEASE_PATH}/{op}"
            status, raw = await client.request("POST", path, orjson.dumps(body), limit)
            check_status(status, raw)
            return parse_object(raw)
        except UpstreamError as exc:
            raise _failure(exc) from None

    async def release(self, url: str, request_ids: list[str]) -> tuple[list[str], list[str]]:
        """Release D's blocks of `request_ids`: (released, unknown to D). Both are free now."""
        data = await self._call(url, "release", {"request_ids": request_ids})
        released, unknown = data.get("released"), data.get("unknown")
        if not (isinstance(released, list) and isinstance(unknown, list)):
            raise LeaseFailure("malformed release answer", maybe_done=True, no_control=False)
        return [str(r) for r in released], [str(u) for u in unknown]

    async def renew(self, url: str, request_ids: list[str], seconds: float) -> Renewal:
        """Move D's deadlines of `request_ids` to D's now + `seconds` (clamped by D)."""
        body = {"request_ids": request_ids, "seconds": seconds}
        data = await self._call(url, "renew", body)
        renewed, unknown, ceiling = data.get("renewed"), data.get("unknown"), data.get("ceiling_s")
        valid = isinstance(renewed, dict) and all(
            isinstance(v, int | float) for v in renewed.values()
        )
        if not (valid and _strings(unknown) and isinstance(ceiling, int | float)):
            raise LeaseFailure("malformed renew answer", maybe_done=True, no_control=False)
        assert isinstance(renewed, dict) and isinstance(unknown, list)
        return Renewal({str(k): float(v) for k, v in renewed.items()}, unknown, float(ceiling))

    async def claim(self, url: str, request_ids: list[str]) -> tuple[list[str], list[str]]:
        """Claim D's leases of `request_ids` for P: (held: claimed, safe to offer; gone: never
        offer them)."""
        data = await self._call(url, "claim", {"request_ids": request_ids})
        held, gone = data.get("held"), data.get("gone")
        if not (_strings(held) and _strings(gone)):
            raise LeaseFailure("malformed claim answer", maybe_done=True, no_control=False)
        assert isinstance(held, list) and isinstance(gone, list)
        return held, gone

    async def unclaim(self, url: str, request_ids: list[str]) -> None:
        """The claimed leases were not offered after all: they may yield to pressure again."""
        await self._call(url, "unclaim", {"request_ids": request_ids})

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _failure(exc: UpstreamError) -> LeaseFailure:
    """What an engine-call failure means for a lease call."""
    if exc.kind == "connect":
        return LeaseFailure(str(exc), maybe_done=False, no_control=False)
    status = exc.status
    if status is not None and (400 <= status < 500 or status == 501):
        no_control = status in (401, 403, 404, 405, 501)  # 404/405: no plugin on that port
        return LeaseFailure(str(exc), maybe_done=False, no_control=no_control)
    return LeaseFailure(str(exc), maybe_done=True, no_control=False)  # 5xx, timeout, protocol
