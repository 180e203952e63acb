"""Where the engines are: a static list, or the ready endpoints of a headless Service.

Kubernetes discovery lists and then watches the EndpointSlices labelled
`kubernetes.io/service-name=<service>` and keeps, per slice, the pod IPs whose `ready`
condition is not false (an absent condition means ready, per the EndpointSlice API). Pod IPs,
not the Service, so every handle names the one pod that holds its blocks. A watch that ends or
fails is resumed from the last resourceVersion; `410 Gone` relists. The turning of slices into
URLs is pure (`ready_urls`).

Credentials: in a pod, the service account (token, CA, KUBERNETES_SERVICE_HOST); elsewhere the
kubeconfig that the `kubernetes` client library would use. The in-cluster token is a projected,
bound token that the kubelet rotates (about hourly, before it expires), so it is read from its
file before every list and watch request, never kept: a watch ends within its `timeoutSeconds`
(300 s) and the next one carries the current token; a request refused with 401 is retried after
`retry_s`, with the token read again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from boomerang.router.apis.sse import split_lines
from boomerang.router.config import KubernetesSource

log = logging.getLogger("boomerang.router")
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def ready_urls(slices: Iterable[Mapping[str, Any]], port: int) -> list[str]:
    """Base URLs of the ready endpoints in these EndpointSlices (sorted, unique)."""
    urls: set[str] = set()
    for s in slices:
        if s.get("addressType", "IPv4") not in ("IPv4", "IPv6"):
            continue
        for ep in s.get("endpoints") or ():
            if (ep.get("conditions") or {}).get("ready") is False:
                continue
            for address in (ep.get("addresses") or ())[:1]:
                host = f"[{address}]" if ":" in address else address
                urls.add(f"http://{host}:{port}")
    return sorted(urls)


@dataclass
class ApiAccess:
    """How to reach the Kubernetes API."""

    server: str
    headers: dict[str, str]
    ssl_context: ssl.SSLContext | bool
    token_file: Path | None = None
    """A Bearer token file read for every request (it rotates), over `headers`."""

    def request_headers(self) -> dict[str, str]:
        """The headers of one request, with the token as the file holds it now."""
        if self.token_file is None:
            return self.headers
        token = self.token_file.read_text().strip()
        return {**self.headers, "Authorization": f"Bearer {token}"}


def api_access(sa_dir: Path = SA_DIR, env: Mapping[str, str] | None = None) -> ApiAccess:
    """In-cluster service account, else the local kubeconfig."""
    env = os.environ if env is None else env
    host = env.get("KUBERNETES_SERVICE_HOST")
    if host and (sa_dir / "token").exists():
        port = env.get("KUBERNETES_SERVICE_PORT", "443")
        ctx = ssl.create_default_context(cafile=str(sa_dir / "ca.crt"))
        host = f"[{host}]" if ":" in host else host
        return ApiAccess(f"https://{host}:{port}", {}, ctx, token_file=sa_dir / "token")
    return _kubeconfig_access()


def _kubeconfig_access() -> ApiAccess:
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    headers = {}
    token = cfg.api_key.get("authorization") or cfg.api_key.get("BearerToken")
    if token:
        headers["Authorization"] = token if token.startswith("Bearer ") else f"Bearer {token}"
    ctx: ssl.SSLContext | bool = False
    if cfg.verify_ssl:
        ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert)
        if cfg.cert_file and cfg.key_file:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    return ApiAccess(cfg.host.rstrip("/"), headers, ctx)


class SliceWatcher:
    """Keeps `on_change(urls)` fed with the ready pod URLs of one Service."""

    def __init__(
        self,
        source: KubernetesSource,
        access: ApiAccess,
        on_change: Callable[[list[str]], None],
        retry_s: float = 2.0,
    ) -> None:
        self.source = source
        self.access = access
        self.on_change = on_change
        self.retry_s = retry_s
        self.slices: dict[str, Mapping[str, Any]] = {}
        self._rv = ""

    @property
    def _url(self) -> str:
        ns = self.source.namespace
        return f"{self.access.server}/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"

    @property
    def _selector(self) -> str:
        return f"kubernetes.io/service-name={self.source.service}"

    def _publish(self) -> None:
        self.on_change(ready_urls(self.slices.values(), self.source.port))

    async def run(self, session: aiohttp.ClientSession) -> None:
        """List, then watch forever (until cancelled)."""
        while True:
            try:
                if not self._rv:
                    await self._list(session)
                await self._watch(session)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # A 401 (an expired token): the retry re-reads the token file.
                refused = isinstance(exc, aiohttp.ClientResponseError) and exc.status == 401
                what = "API server refused the token" if refused else "EndpointSlice watch failed"
                log.warning(what, extra={"error": repr(exc)})
                await asyncio.sleep(self.retry_s)

    async def _list(self, session: aiohttp.ClientSession) -> None:
        params = {"labelSelector": self._selector}
        headers = self.access.request_headers()
        async with session.get(
            self._url, params=params, headers=headers, ssl=self.access.ssl_context
        ) as resp:
            resp.raise_for_status()
            data = await resp.json()
        self.slices = {item["metadata"]["name"]: item for item in data.get("items") or ()}
        self._rv = data.get("metadata", {}).get("resourceVersion", "")
        self._publish()

    async def _watch(self, session: aiohttp.ClientSession) -> None:
        params = {
            "labelSelector": self._selector,
            "watch": "1",
            "resourceVersion": self._rv,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": "300",
        }
        async with session.get(
            self._url,
            params=params,
            headers=self.access.request_headers(),
            ssl=self.access.ssl_context,
            timeout=aiohttp.ClientTimeout(total=None, sock_read=360),
        ) as resp:
            resp.raise_for_status()
            async for line in split_lines(resp.content.iter_any()):
                if line.strip():
                    self.apply(json.loads(line))

    def apply(self, event: Mapping[str, Any]) -> None:
        """Apply one watch event (pure apart from the callback)."""
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                self._rv = ""  # too old: relist
            raise RuntimeError(f"watch error: {obj.get('message')}")
        meta = obj.get("metadata") or {}
        if meta.get("resourceVersion"):
            self._rv = meta["resourceVersion"]
        if kind == "BOOKMARK":
            return
        name = meta.get("name", "")
        if kind == "DELETED":
            self.slices.pop(name, None)
        elif kind in ("ADDED", "MODIFIED"):
            self.slices[name] = obj
        self._publish()
