"""The `tuning` section follows the router's config file while the router runs.

Why it exists: the operator renders the router's config into a ConfigMap and keeps `tuning`
out of the pod's config hash, so a tuning change restarts nothing; the kubelet updates the
mounted file in place (a symlink swap that can take a minute to reach the pod). The router
re-reads the file every `tuning_poll_s` and, when its content changed:
- a valid `tuning` section replaces `config.tuning` on the one `RouterConfig` the app shares
  (every reader, the flow and retention, reads `config.tuning` when it needs it, never a copy
  taken at start), and is logged (`Applied tuning`);
- an invalid one (unreadable file, not YAML, a mapping that fails validation) is logged and
  ignored: the last good tuning stays;
- any other key that changed is logged (`Config changed, restart to apply`) and not applied:
  only `tuning` is hot.
`boomerang_router_tuning_reloads_total{result=ok|error}` counts each re-read of a changed file.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, Final

import yaml
from pydantic import ValidationError

from boomerang.router.config import RouterConfig, Tuning
from boomerang.router.metrics import Metrics

log = logging.getLogger("boomerang.router")
_UNREADABLE: Final = object()
"""What `_parse` returns for a file that is not YAML."""


class TuningReload:
    """Watches one config file's content; `check` applies what changed (see module docs)."""

    def __init__(self, config: RouterConfig, metrics: Metrics, path: Path | None = None) -> None:
        self.config = config
        self.metrics = metrics
        self.path = path if path is not None else config.source_path
        self._content: bytes | None = None
        self._rest: dict[str, Any] = {}
        if self.path is not None:
            self._content = self._read()
            data = self._parse(self._content) if self._content is not None else None
            self._rest = _without_tuning(data) if isinstance(data, dict) else {}

    def _read(self) -> bytes | None:
        assert self.path is not None
        try:
            return self.path.read_bytes()
        except OSError:
            return None

    @staticmethod
    def _parse(content: bytes) -> Any:
        """The file's YAML (an empty file is an empty mapping, as at start); `_UNREADABLE`."""
        try:
            data = yaml.safe_load(content)
        except yaml.YAMLError:
            return _UNREADABLE
        return {} if data is None else data

    def check(self) -> bool | None:
        """Re-read the file: None when it is unchanged (or there is none), True when its
        tuning was valid (applied if it differs), False when it was not (the old one stays)."""
        if self.path is None:
            return None
        content = self._read()
        if content is None or content == self._content:
            return None  # gone for a moment (a symlink swap) or unchanged
        self._content = content
        data = self._parse(content)
        tuning = self._tuning_of(data)
        self.metrics.tuning_reloads.labels("ok" if tuning is not None else "error").inc()
        if isinstance(data, dict):
            self._note_rest(data)
        if tuning is None:
            return False
        if tuning != self.config.tuning:
            self.config.tuning = tuning
            log.info("Applied tuning", extra={"tuning": tuning.model_dump(mode="json")})
        return True

    def _tuning_of(self, data: Any) -> Tuning | None:
        if data is _UNREADABLE:
            log.warning("Kept last tuning", extra={"error": "the config file is not YAML"})
            return None
        if not isinstance(data, dict):
            log.warning("Kept last tuning", extra={"error": "the config file is not a mapping"})
            return None
        try:
            return Tuning.model_validate(data.get("tuning") or {})
        except ValidationError as exc:
            log.warning("Kept last tuning", extra={"error": str(exc)})
            return None

    def _note_rest(self, data: dict[str, Any]) -> None:
        rest = _without_tuning(data)
        keys = rest.keys() | self._rest.keys()
        changed = sorted(k for k in keys if rest.get(k) != self._rest.get(k))
        if changed:
            log.warning("Config changed, restart to apply", extra={"keys": changed})
        self._rest = rest

    async def run(self) -> None:
        """Check every `tuning_poll_s` for the app's lifetime."""
        while True:
            await asyncio.sleep(self.config.tuning_poll_s)
            self.check()


def _without_tuning(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k != "tuning"}
