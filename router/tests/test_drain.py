"""A router told to stop finishes the turns in flight (issue 47: a router replica restarted
with turns in flight): the real `boomerang-router` process over fake engines, SIGTERM while
a stream runs. The stream must end whole, new connections must be refused at once (the pod's
Service then sends elsewhere; `operator/.../routing.py` gives the pod a preStop delay for the
Service's update), and the process must exit once the stream is done, not at the drain's end.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp.test_utils import TestServer
from fake_fabric import Fabric
from router_testing import EngineSpec, FakeEngine, free_port

TOKENS = 100
TPOT_S = 0.05
"""A 5-second stream: SIGTERM strikes after its first token."""


async def _engines() -> AsyncIterator[dict[str, str]]:
    fabric = Fabric()
    servers = []
    urls = {}
    for role in ("prefill", "decode"):
        spec = EngineSpec(
            role=role, engine_id=role[0], fabric=fabric, chunk_per_token=True, chunk_delay_s=TPOT_S
        )
        server = TestServer(FakeEngine(spec).app(), host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        urls[role] = str(server.make_url("")).rstrip("/")
    try:
        yield urls
    finally:
        for server in servers:
            await server.close()


@pytest.fixture
async def router(
    tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[str, subprocess.Popen[bytes]]]:
    drain_s = getattr(request, "param", 30.0)
    async for urls in _engines():
        port = free_port()
        config = {
            "listen_port": port,
            "prefill": {"urls": [urls["prefill"]]},
            "decode": {"urls": [urls["decode"]]},
            "health": {"probe_interval_s": 0.2, "idle_probe": False},
            "shutdown_drain_s": drain_s,
        }
        path = tmp_path / "router.yaml"
        path.write_text(yaml.safe_dump(config))
        proc = subprocess.Popen(
            [sys.executable, "-m", "boomerang.router", "--config", str(path)],
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        url = f"http://127.0.0.1:{port}"
        try:
            await _ready(url, proc)
            yield url, proc
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


async def _ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"the router exited: {proc.returncode}"
            try:
                async with http.get(f"{url}/ready") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    pytest.fail("the router did not become ready")


async def _refused(url: str) -> bool:
    """Whether the router stops taking connections within 3 s (it does so at once)."""
    deadline = time.monotonic() + 3.0
    async with aiohttp.ClientSession() as other:
        while time.monotonic() < deadline:
            try:
                async with other.get(f"{url}/health"):
                    pass
            except aiohttp.ClientConnectionError:
                return True
            await asyncio.sleep(0.05)
    return False


async def _stream_through_sigterm(
    url: str, proc: subprocess.Popen[bytes]
) -> tuple[bool, int, float]:
    """A stream, SIGTERM after its first token: whether it ended with [DONE], its tokens, when
    the signal went (monotonic); checks that the router refused a new connection meanwhile."""
    body: dict[str, Any] = {
        "prompt": "drain me",
        "max_tokens": TOKENS,
        "ignore_eos": True,
        "return_token_ids": True,
        "stream": True,
    }
    tokens, done, stopped_at = 0, False, 0.0
    async with aiohttp.ClientSession() as http:
        try:
            async with http.post(f"{url}/v1/completions", json=body) as resp:
                assert resp.status == 200
                async for raw in resp.content:
                    line = raw.decode().strip()
                    if line == "data: [DONE]":
                        done = True
                        break
                    if not line.startswith("data: "):
                        continue
                    tokens += len(json.loads(line[6:])["choices"][0].get("token_ids") or [])
                    if tokens == 1:
                        stopped_at = time.monotonic()
                        proc.send_signal(signal.SIGTERM)
                        assert await _refused(url), "still listening 3 s after SIGTERM"
        except aiohttp.ClientPayloadError:
            pass  # cut at the drain's end
    return done, tokens, stopped_at


async def test_sigterm_lets_the_stream_in_flight_finish_and_refuses_new_turns(
    router: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, proc = router
    done, tokens, stopped_at = await _stream_through_sigterm(url, proc)
    assert done, "the stream in flight was cut"
    assert tokens == TOKENS  # every token came
    assert await asyncio.to_thread(proc.wait, 20) == 0  # the fake engines keep serving
    assert time.monotonic() - stopped_at < 15  # it left once the stream was done


@pytest.mark.parametrize("router", [0.5], indirect=True)
async def test_a_stream_longer_than_the_drain_window_is_cut_at_its_end(
    router: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, proc = router
    done, tokens, stopped_at = await _stream_through_sigterm(url, proc)
    assert not done and tokens < TOKENS
    await asyncio.to_thread(proc.wait, 20)
    assert time.monotonic() - stopped_at < TOKENS * TPOT_S  # before the stream could end


def test_the_drain_window_is_validated() -> None:
    from pydantic import ValidationError

    from boomerang.router.config import RouterConfig

    with pytest.raises(ValidationError, match="shutdown_drain_s"):
        RouterConfig.model_validate({"shutdown_drain_s": 0})
