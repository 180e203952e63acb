"""aiohttp's ClientSession behind the same interface as `engine_http.HttpClient` (measurement).

Why it exists: to measure aiohttp's client against the custom one behind the one facade
(`upstream.py`), with the same errors: `ConnectError` when the engine never saw the request,
`HttpError` after, `TimeoutError` past a limit.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from functools import lru_cache

import aiohttp
from yarl import URL

from boomerang.router.engine_http import ConnectError, HttpError, Limits


@lru_cache(maxsize=4096)
def _url(url: str) -> URL:
    return URL(url, encoded=True)


@lru_cache(maxsize=64)
def _timeout(total: float | None, connect: float) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=total, connect=connect)


class _Stream:
    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status

    async def iter_any(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._resp.content.iter_any():
                yield chunk
        except aiohttp.ClientError as exc:
            raise HttpError(repr(exc)) from None

    async def read(self) -> bytes:
        try:
            return await self._resp.read()
        except aiohttp.ClientError as exc:
            raise HttpError(repr(exc)) from None

    def close(self) -> None:
        self._resp.close()

    def release(self) -> None:
        self._resp.release()


class AiohttpClient:
    """Keep-alive connections to engines through one aiohttp ClientSession."""

    def __init__(self, headers: dict[str, str] | None = None, *, idle_s: float = 4.0) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=idle_s)
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers=headers,
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None),
        )

    async def _send(
        self, method: str, url: str, body: bytes | None, limits: Limits, request_id: str | None
    ) -> aiohttp.ClientResponse:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        if request_id is not None:
            headers["X-Request-Id"] = request_id
        try:
            return await self._session.request(
                method,
                _url(url),
                data=body,
                headers=headers,
                timeout=_timeout(limits.total, limits.connect),
            )
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            raise ConnectError(repr(exc)) from None
        except TimeoutError:
            raise
        except aiohttp.ClientError as exc:
            raise HttpError(repr(exc)) from None

    async def request(
        self,
        method: str,
        url: str,
        body: bytes | None,
        limits: Limits,
        *,
        request_id: str | None = None,
    ) -> tuple[int, bytes]:
        resp = await self._send(method, url, body, limits, request_id)
        try:
            return resp.status, await resp.read()
        except aiohttp.ClientError as exc:
            resp.close()
            raise HttpError(repr(exc)) from None
        except BaseException:
            resp.close()
            raise
        finally:
            resp.release()

    async def stream(
        self,
        method: str,
        url: str,
        body: bytes | None,
        limits: Limits,
        headers_s: float,
        *,
        request_id: str | None = None,
    ) -> _Stream:
        async with asyncio.timeout(headers_s):
            resp = await self._send(method, url, body, limits, request_id)
        return _Stream(resp)

    async def close(self) -> None:
        await self._session.close()
