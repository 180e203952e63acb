"""`boomerang up` runs the replicas a manifest asks for: two prefill engines and one decoder.

The local CPU manifest with `spec.prefill.replicas: 2`, started by the local runtime's own
`stack.up` (what `boomerang up` calls), with real vLLM CPU engines and the real router. Each
prefill replica listens on its own ports with its own NIXL engine id, both share core 0 (two
cores here, and prefill never shares the decoder's core), the router spreads turns over both,
and every turn's answer is what one engine computing the prompt alone gives (float32,
greedy), including turns where a replica pulled the history back from the decoder.

Three engines need three times one engine's memory (the tiny model's engine: about 3.1 GiB
RSS, measured); skipped like the data-plane tests when the engine venv is absent outside CI.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from boomerang.connector.launch import engine_venv
from boomerang.local import pdclient, processes, stack
from boomerang.local.engine_client import tokens_by_source, totals

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
PORTS = stack.LocalPorts(
    router=17080, prefill=17100, decode=17200, prefill_side_channel=17600, decode_side_channel=17700
)
MAX_TOKENS = 8
LOGPROB_TOL = 1e-5
"""As the data-plane tests: identical tokens, logprobs within float32 rounding of batch shapes."""


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    ci = bool(os.environ.get("CI"))
    try:
        venv = engine_venv.ensure(check=not ci)
    except RuntimeError as exc:
        pytest.fail(f"engine venv install failed under CI: {exc}")
    if venv is None:
        pytest.skip("engine venv not installed (make engine); CI unset")
    work = tmp_path_factory.mktemp("replicas")
    data = yaml.safe_load((REPO / "examples" / "local-cpu.yaml").read_text())
    data["spec"]["prefill"]["replicas"] = 2
    manifest = work / "two-prefill.yaml"
    manifest.write_text(yaml.safe_dump(data))
    lines: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        # Its own run directory, so a stack the user has up is neither seen nor stopped.
        patch.setattr(stack, "run_dir", lambda env=None: work / "local")
        try:
            endpoint = stack.up(manifest, PORTS, log=lines.append)
            state = stack.status()
            assert state is not None
            yield {**state, "endpoint": endpoint, "lines": lines}
        finally:
            stack.down(log=lambda _m: None)


def completion(url: str, model: str, prompt: list[int], **extra: Any) -> dict[str, Any]:
    body = {**pdclient.completion_body(model, prompt, MAX_TOKENS), **extra}
    return pdclient.post(f"{url}/v1/completions", body)


def answer(resp: dict[str, Any]) -> tuple[list[int], list[float]]:
    choice = resp["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def reuse(router: str) -> dict[str, float]:
    return totals(pdclient.scrape(router), "boomerang_router_reuse_total", "outcome")


def sources(urls: list[str]) -> list[dict[str, float]]:
    return [tokens_by_source(pdclient.scrape(url)) for url in urls]


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_each_replica_runs_on_its_own_ports_and_cores(up) -> None:
    names = [p["name"] for p in up["processes"]]
    assert names == ["prefill-0", "prefill-1", "decode-0", "router"]
    assert all(p["alive"] for p in up["processes"])
    assert up["engines"] == {
        "prefill": ["http://127.0.0.1:17100", "http://127.0.0.1:17101"],
        "decode": ["http://127.0.0.1:17200"],
    }
    for url in up["engines"]["prefill"] + up["engines"]["decode"]:
        assert processes.is_healthy(f"{url}/health")
    envs = {p["name"]: environ(p["pid"]) for p in up["processes"][:3]}
    side = {name: env["VLLM_NIXL_SIDE_CHANNEL_PORT"] for name, env in envs.items()}
    assert side == {"prefill-0": "17600", "prefill-1": "17601", "decode-0": "17700"}
    cores = {name: env["BOOMERANG_KV_CPUS"] for name, env in envs.items()}
    assert all(env["VLLM_CPU_OMP_THREADS_BIND"] == cores[n] for n, env in envs.items())
    assert cores["decode-0"] not in (cores["prefill-0"], cores["prefill-1"])
    if len(os.sched_getaffinity(0)) == 2:  # three engines on two cores: the prefills share
        assert cores == {"prefill-0": "0", "prefill-1": "0", "decode-0": "1"}
        assert (
            "Sharing cores: prefill-0, prefill-1 share core 0 (3 engines on 2 cores)"
            in (up["lines"])
        )


def test_each_prefill_replica_has_its_own_nixl_engine_id(up) -> None:
    """P's answer names its engine id and side channel for D to pull from; each replica must
    name its own, or D would read KV from the wrong engine."""
    decode = up["engines"]["decode"][0]
    rng = random.Random(3)
    seen = []
    for url in up["engines"]["prefill"]:
        prompt = [rng.randrange(16, 8000) for _ in range(64)]
        fresh = dict(pdclient.FRESH)
        p_resp = completion(url, up["model"], prompt, max_tokens=1, kv_transfer_params=fresh)
        params = p_resp["kv_transfer_params"]
        seen.append((params["remote_engine_id"], params["remote_port"]))
        # D pulls P's blocks, which frees them on P.
        completion(decode, up["model"], prompt, kv_transfer_params=params)
    (id0, port0), (id1, port1) = seen
    assert id0 and id1 and id0 != id1
    assert (port0, port1) == (17600, 17601)


def test_the_router_spreads_turns_over_both_and_answers_as_one_engine(up) -> None:
    router = up["endpoint"].removesuffix("/v1")
    prefill = up["engines"]["prefill"]
    before, reuse_before = sources(prefill), reuse(router)
    rng = random.Random(11)
    turns = []
    for conv in range(3):
        prompt = [rng.randrange(16, 8000) for _ in range(300)]
        for _turn in range(2):
            resp = completion(router, up["model"], prompt, conversation_id=f"conv-{conv}")
            turns.append((list(prompt), answer(resp)))
            prompt = (
                prompt
                + resp["choices"][0]["token_ids"]
                + [rng.randrange(16, 8000) for _ in range(80)]
            )
    after = sources(prefill)
    outcomes = {k: v - reuse_before.get(k, 0.0) for k, v in reuse(router).items()}
    assert {k: v for k, v in outcomes.items() if v} == {
        "miss": 3.0,
        "hit": 3.0,
    }
    moved = [
        {k: v - b.get(k, 0.0) for k, v in a.items()} for b, a in zip(before, after, strict=True)
    ]
    assert all(m.get("local_compute", 0.0) > 0 for m in moved), moved  # both replicas served
    # Each second turn pulled the first turn's whole KV blocks back from D (308 tokens: at
    # least 256 whatever the block size).
    assert sum(m.get("external_kv_transfer", 0.0) for m in moved) >= 3 * 256, moved
    for prompt, (tokens, logprobs) in turns:
        ref_tokens, ref_logprobs = answer(completion(prefill[0], up["model"], prompt))
        assert tokens == ref_tokens
        assert logprobs == pytest.approx(ref_logprobs, abs=LOGPROB_TOL)
