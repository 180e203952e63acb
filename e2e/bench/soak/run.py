"""The soak: steady multi-turn load through two router replicas over Redis while faults strike.

Why: faults were tested one at a time, between turns, on an idle stack; users meet them under
load. This runs vLLM's own multi-turn client (fetched at run time, `multiturn_client.py`)
against the local CPU stack (one P, one D, Boomerang's engines; two router replicas sharing
conversations through Redis, behind nginx as their Service: a request goes to either replica,
and to the other when one refuses the connection, as kube-proxy and an ingress send only to
pods that listen) for a bounded time, in runs of fresh conversations. Into each run, once
turns are in flight, one fault is injected:

- `kill-d`: SIGKILL to D's process group mid-stream (streams are carried over, turns go to P
  alone until D is back), then D started again;
- `kill-p`: SIGKILL to P's process group while turns prefill and pull, then P started again;
- `stop-d`, `stop-p`: SIGSTOP of an engine's group for `STOP_S`, then SIGCONT (a stall, not a
  death: nothing may be lost, nothing may time out);
- `restart-router`: SIGKILL to replica B with turns in flight, then B started again (a crash:
  the turns B was serving break, and must be the only ones lost);
- `drain-router`: SIGTERM to replica B with turns in flight, as a rolling update or a node
  drain stops a pod, then B started again once it exited (it stops listening, finishes its
  turns in flight, exits: nothing may be lost);
- `restart-redis`: SIGKILL to Redis, then Redis started again, empty (handles are lost:
  turns recompute, none may fail);
- `fill-d`: another client fills D's KV for `FILL_S` (long prompts of random ids sent to D
  directly, streaming long answers, then dropped): D must give up what it retains (its leases
  yield under memory pressure) and preempt, and the soak's turns wait; none may be lost.

Per fault it reports the turns it touched (requests in flight between the fault and the
stack's recovery), turns lost by the client's own count (expected against answered), the
errors the client saw, the recovery time (until both replicas are ready with P and D and a
turn through each succeeds), and then, once for the soak: D's retained blocks after the last
run (they must drain to 0 within the decoder TTL, which the soak sets short), and replica A's
RSS and open sockets before and after.

    make soak                                   # 20 minutes, every fault in turn
    make soak ARGS="--minutes 8 --faults kill-d,stop-d --publish"

`--publish` writes the table into `docs/reliability.md`. Needs the engine venv, the model,
`redis-server` (`make redis`), `nginx` (`make nginx`) and vLLM's client (fetched and cached
on first use).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from boomerang.connector.launch.model import corpus, model_dir
from boomerang.local import engine_client, pdclient, processes, stack
from boomerang.router.engines.health import block_size_from_metrics, kv_blocks_from_metrics

from bench.harness import multiturn_client
from bench.harness.engine_watch import KV_USAGE, busy
from bench.harness.repo import REPO, RESULTS
from bench.production.engines import Engines, engines, retained_blocks
from bench.production.engines import manifest as regime_manifest
from bench.production.modes import REGIMES, Workload, generator_config
from bench.production.run import source_revision

FAULTS = (
    "kill-d",
    "stop-d",
    "restart-router",
    "drain-router",
    "kill-p",
    "stop-p",
    "restart-redis",
    "fill-d",
)
STOP_S = 7.0
"""How long a stopped engine stays stopped (the issue's 5-10 s)."""
FILL_S = 15.0
"""How long the `fill-d` fault's requests stream on D once they all run."""
FILL_SHARE = 1.25
"""The `fill-d` fault's prompts hold this share of D's KV in all (more than it has: D must
free what it retains and preempt to run them)."""
FULL = 0.95
"""D's KV use at which the `fill-d` fault counts it full."""
FILL_WAIT_S = 120.0
"""The longest the `fill-d` fault waits for D's KV to fill (prefilling its prompts)."""
D_BLOCKS = 600
"""D's KV in the soak, blocks of 128 tokens (76,800 tokens, as the agentic regime's): what a
run's conversations retain comes near it, and the `fill-d` fault can fill it in seconds (the
CPU engine's own KV space would hold millions of tokens)."""
FAULT_AT_S = 8.0
"""Seconds into a run when its fault strikes: the clients' first turns are in flight (a run's
turns take 20-60 s here; at 25 s they had all been answered)."""
DECODER_TTL_S = 90
"""The soak's decoder TTL: short, so that what D retains after the last run must drain (to 0)
within a bounded wait; a block still retained after it is a leak."""
WORKLOAD = Workload(conversations=24, clients=8, messages=(6, 8), first=(600, 1200))
"""Per run: 24 conversations of 3-4 turns, 4 clients per replica: turns always in flight."""
DRAIN_S = 120.0
"""The replicas' `shutdown_drain_s`: longer than any of the soak's turns, so a drained replica
finishes every turn it holds."""
PREFILL_TIMEOUT_S = 90.0
"""The routers' prefill timeout: a first turn here prefills in seconds, and a D killed under
P's read leaves P's request waiting on the transfer until this ends it (vLLM defers the
failure until its outstanding transfers finish), so it bounds what that fault costs a turn."""
RECOVERY_BOUND_S = 900.0
"""A stack not recovered by then is reported as such (recovery at the bound)."""
ROUTER_PORTS = (38080, 38081)
FRONT_PORT = 38090
"""nginx, in front of both replicas: where the clients send."""
REDIS_PORT = 38379
RESULT = RESULTS / "soak.json"
PUBLISH_START = "<!-- soak:start -->"
PUBLISH_END = "<!-- soak:end -->"


@dataclass
class Stack:
    """What the soak runs: the engines, Redis and the two replicas (name -> pid)."""

    es: Engines
    run_dir: Path
    redis: processes.ProcessSpec
    routers: dict[str, processes.ProcessSpec] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{ROUTER_PORTS[list(self.routers).index(name)]}"

    @property
    def front(self) -> str:
        return f"http://127.0.0.1:{FRONT_PORT}"

    def start(self, spec: processes.ProcessSpec, timeout_s: float = 900.0) -> None:
        self.pids[spec.name] = processes.spawn(spec).pid
        if spec.name == "redis":
            wait_answer("redis-server", REDIS_PORT, redis_answers, self.pids[spec.name], timeout_s)
        elif spec.name == "nginx":
            wait_answer("nginx", FRONT_PORT, front_listens, self.pids[spec.name], timeout_s)
        else:
            processes.wait_healthy(spec, self.pids[spec.name], timeout_s)


def redis_answers() -> bool:
    """Whether a Redis answers PING on the soak's port."""
    with (
        contextlib.suppress(OSError),
        socket.create_connection(("127.0.0.1", REDIS_PORT), timeout=1.0) as conn,
    ):
        conn.sendall(b"PING\r\n")
        return conn.recv(16).startswith(b"+PONG")
    return False


def wait_answer(
    name: str, port: int, answers: Callable[[], bool], pid: int, timeout_s: float
) -> None:
    """Until the process just started answers on its port (`answers`); it exiting first, or
    not answering in time, ends the soak. For Redis the answer is its PING: `soak_stack`
    refuses to start while another Redis answers there, which would answer for this one and
    outlive its restarts."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not processes.alive(pid):
            sys.exit(f"{name} exited while starting (is port {port} taken?)")
        if answers():
            return
        time.sleep(0.2)
    sys.exit(f"{name} did not answer in time")


def redis_spec(run_dir: Path) -> processes.ProcessSpec:
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is missing: run `make redis`")
    return processes.ProcessSpec(
        name="redis",
        cmd=[binary, "--port", str(REDIS_PORT), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"],
        env=dict(os.environ),
        log=run_dir / "redis.log",
        health_url="",
    )  # fmt: skip


NGINX_CONF = """daemon off;
worker_processes 1;
pid {run}/nginx.pid;
error_log {run}/nginx-error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {run}/nginx-body;
  proxy_temp_path {run}/nginx-proxy;
  upstream routers {{
{servers}
  }}
  server {{
    listen 127.0.0.1:{port};
    client_max_body_size 64m;
    client_body_buffer_size 64m;  # bodies in memory: the worker need not reach the run folder
    location / {{
      proxy_pass http://routers;
      proxy_http_version 1.1;
      proxy_buffering off;
      proxy_connect_timeout 2s;
      proxy_read_timeout 1800s;
      proxy_send_timeout 1800s;
      proxy_next_upstream error timeout;
    }}
  }}
}}
"""
"""The replicas' Service. A fresh connection to a replica per request (no upstream keepalive):
a replica that stopped listening refuses it before the request is sent, and nginx sends it
to the other (`proxy_next_upstream error`), as a Service sends only to pods that listen."""


def front_spec(run_dir: Path) -> processes.ProcessSpec:
    binary = shutil.which("nginx")
    if binary is None:
        sys.exit("nginx is missing: run `make nginx`")
    servers = "\n".join(
        f"    server 127.0.0.1:{port} max_fails=1 fail_timeout=2s;" for port in ROUTER_PORTS
    )
    conf = run_dir / "nginx.conf"
    conf.write_text(NGINX_CONF.format(run=run_dir, servers=servers, port=FRONT_PORT))
    return processes.ProcessSpec(
        name="nginx",
        cmd=[binary, "-c", str(conf), "-p", str(run_dir), "-e", str(run_dir / "nginx-error.log")],
        env=dict(os.environ),
        log=run_dir / "nginx.log",
        health_url="",
    )


def front_listens() -> bool:
    """Whether nginx accepts connections on the front's port."""
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", FRONT_PORT), 1):
        return True
    return False


def router_spec(
    s: Stack, name: str, port: int, timeouts: dict[str, float]
) -> processes.ProcessSpec:
    settings = stack.router_settings(
        s.es.dd, s.es.ports, listen_port=port, log_json=True,
        lease_token_file=str(stack.lease_token_file(s.es.run_dir)),
        store={"kind": "redis", "url": f"redis://127.0.0.1:{REDIS_PORT}/0"},
        timeouts=timeouts, shutdown_drain_s=DRAIN_S,
    )  # fmt: skip
    cfg = s.run_dir / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump(settings))
    return stack.router_spec(name, cfg, port, s.run_dir, dict(os.environ))


def one_turn(url: str, model: str, timeout_s: float = 120.0) -> bool:
    """One short turn through a router: whether it was answered."""
    body = {"model": model, "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 4}  # fmt: skip
    try:
        return bool(pdclient.post(f"{url}/v1/chat/completions", body, timeout_s).get("choices"))
    except (OSError, ValueError):
        return False


def recovered(s: Stack, model: str) -> bool:
    """Both replicas ready with P and D, and a turn through each and through the front
    answered."""
    for name in s.routers:
        ready = pdclient.get_json(f"{s.url(name)}/ready", 5.0)  # {}: no answer
        if not (ready.get("prefill") and ready.get("decode")):
            return False
    urls = [*(s.url(name) for name in s.routers), s.front]
    return all(one_turn(url, model) for url in urls)


def proc_usage(pid: int) -> dict[str, float]:
    """A process's RSS (MiB) and open sockets, from /proc."""
    rss = 0.0
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
    sockets = 0
    with contextlib.suppress(OSError):
        for fd in os.scandir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                sockets += os.readlink(fd.path).startswith("socket:")
    return {"rss_mib": round(rss, 1), "sockets": sockets}


def signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(os.getpgid(pid), sig)


def strike(s: Stack, fault: str) -> None:
    """Inject `fault` (module docs) and return once its action is done (an engine or router
    started again, an engine resumed)."""
    role = {"kill-d": "decode-0", "kill-p": "prefill-0", "stop-d": "decode-0",
            "stop-p": "prefill-0"}.get(fault)  # fmt: skip
    if fault in ("kill-d", "kill-p"):
        assert role is not None
        processes.kill(s.es.pids[role])
        s.es.pids[role] = processes.spawn(s.es.specs[role]).pid
        processes.wait_healthy(s.es.specs[role], s.es.pids[role], 900)
    elif fault in ("stop-d", "stop-p"):
        assert role is not None
        signal_group(s.es.pids[role], signal.SIGSTOP)
        time.sleep(STOP_S)
        signal_group(s.es.pids[role], signal.SIGCONT)
    elif fault == "restart-router":
        name = list(s.routers)[1]
        processes.kill(s.pids[name])
        s.start(s.routers[name], 60)
    elif fault == "drain-router":
        name = list(s.routers)[1]
        pid = s.pids[name]
        signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + DRAIN_S + 30
        while processes.alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if processes.alive(pid):
            sys.exit(f"{name} did not exit within its drain ({DRAIN_S:.0f} s) after SIGTERM")
        s.start(s.routers[name], 60)
    elif fault == "fill-d":
        fill_decoder(s.es.decode[0], s.es.dd.spec.model.served_name)
    elif fault == "restart-redis":
        processes.kill(s.pids["redis"])
        if redis_answers():
            sys.exit("Redis still answers after it was killed: another one serves its port")
        s.start(s.redis, 30)
    else:
        raise ValueError(f"unknown fault {fault!r}")


def fill_decoder(d_url: str, model: str) -> None:
    """Fill D's KV from outside the routers (`fill-d`): `FILL_SHARE` of D's blocks in prompts
    of random ids no longer than half D's context, each streaming a long answer, until D's KV
    is `FULL` used (at most `FILL_WAIT_S`); `FILL_S` more, then every connection dropped
    (vLLM aborts a request whose client went away)."""
    page = engine_client.scrape(d_url).encode()
    kv_tokens = kv_blocks_from_metrics(page) * block_size_from_metrics(page)
    if not kv_tokens:
        sys.exit(f"{d_url} does not say its KV size (vllm:cache_config_info)")
    context = int(pdclient.get_json(f"{d_url}/v1/models")["data"][0]["max_model_len"])
    length = min(context // 2, kv_tokens)
    rng = random.Random(int(FILL_S))
    prompts = [
        [rng.randrange(16, 8000) for _ in range(length)]
        for _ in range(max(1, round(FILL_SHARE * kv_tokens / length)))
    ]
    stop = threading.Event()

    def one(prompt: list[int]) -> None:
        body = {"model": model, "prompt": prompt, "max_tokens": context - length - 1,
                "ignore_eos": True, "stream": True}  # fmt: skip
        with contextlib.suppress(OSError, ValueError):
            for _ in engine_client.stream_events(f"{d_url}/v1/completions", body, timeout=600):
                if stop.is_set():
                    return  # leaving the loop closes the connection: vLLM aborts it

    threads = [threading.Thread(target=one, args=(p,), daemon=True) for p in prompts]
    for t in threads:
        t.start()
    deadline = time.monotonic() + FILL_WAIT_S
    while time.monotonic() < deadline and kv_used(d_url) < FULL:
        time.sleep(0.5)
    time.sleep(FILL_S)
    stop.set()
    for t in threads:
        t.join(timeout=120)


def kv_used(d_url: str) -> float:
    """D's share of KV blocks in use (0-1, the benchmark's own reading of
    `vllm:kv_cache_usage_perc`, `engine_watch.busy`); 0 unread."""
    with contextlib.suppress(OSError, ValueError):
        return busy(engine_client.scrape(d_url))[KV_USAGE]
    return 0.0


ANSI = re.compile(r"\x1b\[[0-9;]*m")
"""The client colours its log lines."""
ERROR_LINE = re.compile(r"(error|exception|status[ =:]+[45]\d\d|failed)", re.I)


def client_errors(log_text: str, limit: int = 3) -> list[str]:
    """The distinct error lines the client logged (its own words: what a user would see)."""
    seen: list[str] = []
    for line in log_text.splitlines():
        line = re.sub(r"^\S+ \S+ ", "", ANSI.sub("", line).strip())[:200]
        if ERROR_LINE.search(line) and "num_failures=0" not in line and line not in seen:
            seen.append(line)
    return seen[:limit]


def touched(records: Sequence[dict[str, Any]], start: float, end: float) -> int:
    """Requests in flight at some moment of [start, end] (`time.monotonic()` seconds: the
    client stamps its records on the same clock, in ms)."""
    out = 0
    for r in records:
        t0 = r["start_time_ms"] / 1000
        if t0 <= end and t0 + r["latency_ms"] / 1000 >= start:
            out += 1
    return out


@dataclass
class Args:
    minutes: float
    faults: list[str]
    out: Path
    publish: bool
    seed: int


def one_run(
    s: Stack, a: Args, client: multiturn_client.Client, serial: int, fault: str
) -> dict[str, Any]:
    """Fresh conversations through both replicas, `fault` struck `FAULT_AT_S` in."""
    work = a.out / f"{serial:02d}-{fault}"
    work.mkdir(parents=True, exist_ok=True)
    (work / "text.txt").write_text("\n".join(corpus(seed=7000 + serial, lines=4000)) + "\n")
    config = {**generator_config(WORKLOAD), "num_conversations": WORKLOAD.conversations}
    conversations = multiturn_client.generate(
        client, config=config, model_dir=model_dir("tiny"), seed=a.seed + serial,
        prefix=f"s{serial:02d}-", workdir=work,
    )  # fmt: skip
    results: dict[str, list[dict[str, Any]]] = {}

    def drive() -> None:
        results["front"] = multiturn_client.run(
            client, url=s.front, model_dir=model_dir("tiny"),
            served_name=s.es.dd.spec.model.served_name, config=conversations,
            clients=WORKLOAD.clients, seed=a.seed + serial, workdir=work / "front",
            timeout_s=1800,
        )  # fmt: skip

    threads = [threading.Thread(target=drive)]
    for t in threads:
        t.start()
    time.sleep(FAULT_AT_S)
    struck = time.monotonic()  # the client's records are on this clock (CLOCK_MONOTONIC)
    strike(s, fault)
    model = s.es.dd.spec.model.served_name
    while not recovered(s, model) and time.monotonic() - struck < RECOVERY_BOUND_S:
        time.sleep(0.5)
    back = time.monotonic()
    for t in threads:
        t.join()
    records = [r for rs in results.values() for r in rs]
    expected = multiturn_client.expected_turns(conversations)
    answered = 0
    errors: list[str] = []
    for name in results:
        text = (work / name / "client.log").read_text(errors="replace")
        said = multiturn_client.answered(text)
        answered += said if said is not None else len(results.get(name, ()))
        errors += client_errors(text)
    return {
        "fault": fault,
        "serial": serial,
        "expected": expected,
        "answered": answered,
        "lost": max(0, expected - answered),
        "touched": touched(records, struck, back),
        "recovery_s": round(back - struck, 1),
        "errors": errors[:3],
    }


def drain_s(s: Stack, bound_s: float) -> tuple[float, float]:
    """Seconds until D retains nothing (after the last run), and what it still retains at the
    bound (0 when it drained)."""
    start = time.monotonic()
    while (left := retained_blocks(s.es)) > 0 and time.monotonic() - start < bound_s:
        time.sleep(2.0)
    return round(time.monotonic() - start, 1), left


def table(res: dict[str, Any]) -> str:
    lines = [
        "| fault | runs | turns touched | turns lost | recovery (s) | what the client saw |",
        "|---|---|---|---|---|---|",
    ]
    by: dict[str, list[dict[str, Any]]] = {}
    for run in res["runs"]:
        by.setdefault(run["fault"], []).append(run)
    for fault, runs in by.items():
        errs = sorted({e for r in runs for e in r["errors"]})
        said = "; ".join(f"`{e[:90]}`" for e in errs[:2]) or "no error"
        lines.append(
            f"| {fault} | {len(runs)} | {sum(r['touched'] for r in runs)} | "
            f"{sum(r['lost'] for r in runs)} of {sum(r['expected'] for r in runs)} | "
            f"{', '.join(str(r['recovery_s']) for r in runs)} | {said} |"
        )
    a, b = res["router_a"]["before"], res["router_a"]["after"]
    growth = (b["rss_mib"] / a["rss_mib"] - 1) * 100 if a["rss_mib"] else 0.0
    lines += [
        "",
        f"After the last run, D retained {res['retained_after']:.0f} blocks "
        f"{res['drain_s']:.0f} s later (decoder TTL {DECODER_TTL_S} s). Replica A (never "
        f"restarted): RSS {a['rss_mib']:.0f} -> {b['rss_mib']:.0f} MiB ({growth:+.0f} %), "
        f"sockets {a['sockets']} -> {b['sockets']}. {res['minutes']:.0f} minutes, "
        f"{len(res['runs'])} runs, source {res.get('revision') or 'unknown'}.",
    ]
    return "\n".join(lines)


def publish(res: dict[str, Any]) -> None:
    doc = REPO / "docs" / "reliability.md"
    text = doc.read_text()
    start, end = text.index(PUBLISH_START), text.index(PUBLISH_END)
    body = f"{PUBLISH_START}\n{table(res)}\n{PUBLISH_END}"
    doc.write_text(text[:start] + body + text[end + len(PUBLISH_END) :])


def parse_args() -> Args:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--minutes", type=float, default=20.0, help="start no run after this")
    ap.add_argument("--faults", default=",".join(FAULTS), help="in turn, cycled")
    ap.add_argument("--out", type=Path, default=None, help="work folder (default: a temp one)")
    ap.add_argument("--publish", action="store_true", help="write docs/reliability.md's table")
    ap.add_argument("--seed", type=int, default=47)
    ns = ap.parse_args()
    faults = [f for f in ns.faults.split(",") if f]
    if unknown := [f for f in faults if f not in FAULTS]:
        ap.error(f"unknown faults {unknown}; known: {', '.join(FAULTS)}")
    out = ns.out or Path(tempfile.mkdtemp(prefix="boomerang-soak-"))
    return Args(ns.minutes, faults, out, ns.publish, ns.seed)


def manifest() -> Any:
    """The benchmark's spare regime (one P with its prefix cache, one D), bidirectional, with
    the soak's short decoder TTL and D's KV bounded (`D_BLOCKS`)."""
    from boomerang.operator.api import DisaggregatedDeployment

    regime = replace(REGIMES["spare"], d_blocks=D_BLOCKS)
    data = regime_manifest(regime, bidirectional=True).model_dump(
        mode="json", by_alias=True, exclude_none=True
    )
    data["spec"]["kvTransfer"]["decoderBlocksTTL"] = f"{DECODER_TTL_S}s"
    data["spec"].get("router", {}).pop("conversationTTL", None)  # derived from it
    return DisaggregatedDeployment.model_validate(data)


@contextlib.contextmanager
def soak_stack(venv: Path, run_dir: Path) -> Iterator[Stack]:
    dd = manifest()
    with engines(dd, venv) as es:
        s = Stack(es, run_dir, redis_spec(run_dir))
        try:
            if redis_answers():
                sys.exit(f"a Redis already answers on port {REDIS_PORT}: stop it first")
            s.start(s.redis, 30)
            timeouts = {"prefill_s": PREFILL_TIMEOUT_S, "decode_first_byte_s": PREFILL_TIMEOUT_S,
                        "decode_total_s": 600.0}  # fmt: skip
            for name, port in zip(("router-a", "router-b"), ROUTER_PORTS, strict=True):
                s.routers[name] = router_spec(s, name, port, timeouts)
                s.start(s.routers[name], 60)
            s.start(front_spec(run_dir), 30)
            yield s
        finally:
            for pid in reversed(list(s.pids.values())):
                processes.stop(pid, timeout=30)


def main() -> None:
    a = parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    venv = stack.ensure_engine_venv()
    client = multiturn_client.ensure()
    run_dir = a.out / "stack"
    run_dir.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"minutes": a.minutes, "revision": source_revision(REPO), "runs": []}
    with soak_stack(venv, run_dir) as s:
        model = s.es.dd.spec.model.served_name
        if not recovered(s, model):
            sys.exit("the stack does not answer before any fault")
        a_pid = s.pids["router-a"]
        before = proc_usage(a_pid)
        deadline = time.monotonic() + a.minutes * 60
        serial = 0
        while time.monotonic() < deadline:
            fault = a.faults[serial % len(a.faults)]
            serial += 1
            run = one_run(s, a, client, serial, fault)
            res["runs"].append(run)
            print(
                f"  {serial:02d} {fault}: lost {run['lost']} of {run['expected']}, touched "
                f"{run['touched']}, recovered in {run['recovery_s']} s"
                + (f", client saw: {run['errors'][0]}" if run["errors"] else ""),
                flush=True,
            )
        res["drain_s"], res["retained_after"] = drain_s(s, DECODER_TTL_S + 60)
        res["router_a"] = {"before": before, "after": proc_usage(a_pid)}
    (a.out / "soak.json").write_text(json.dumps(res, indent=1) + "\n")
    RESULT.write_text(json.dumps(res, indent=1) + "\n")
    print(f"work in {a.out}; results in {RESULT}")
    if idle := [r["serial"] for r in res["runs"] if not r["touched"]]:
        print(f"warning: runs {idle} struck no turn in flight: their faults tested nothing")
    print(table(res))
    if a.publish:
        publish(res)


if __name__ == "__main__":
    main()
