"""Who is calling: optional Bearer API keys, and the tenant that scopes conversations.

With an API keys file (one `key [tenant]` per line, `#` comments), a request without a listed
key gets 401, and its tenant is the one named on the key's line (or one derived from the key).
Without a file, anyone may call; the tenant is derived from whatever Bearer token is sent (a
gateway in front may authenticate), else a shared anonymous tenant. Keys are held only as
SHA-256 digests, so neither logs nor memory dumps show them.

The file is re-read when it changes (`KeyFile.refresh`, polled by the app), so rotating a key
needs no restart. Kubernetes updates a mounted Secret by writing a new directory and swapping
the `..data` symlink, so a change is seen by `stat` through the links (device, inode, size and
times of the file they resolve to). An update that cannot be read, is not UTF-8, or holds no
key keeps the last good keys: a botched Secret must not lock every client out.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
from pathlib import Path

from boomerang.router.errors import ApiError

log = logging.getLogger("boomerang.router")
ANONYMOUS = "anonymous"
Stamp = tuple[int, int, int, int, int]
"""One version of a file: device, inode, size, mtime and ctime (ns)."""


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def parse_keys(text: str) -> dict[bytes, str]:
    """Digest of each key -> its tenant."""
    keys: dict[bytes, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        key = parts[0]
        tenant = parts[1] if len(parts) > 1 else "key-" + _digest(key).hex()[:16]
        keys[_digest(key)] = tenant
    return keys


def load_keys(path: str) -> dict[bytes, str]:
    """Read an API keys file; an empty file is an error (it would lock everyone out)."""
    keys = parse_keys(Path(path).read_text())
    if not keys:
        raise ValueError(f"{path}: no API keys")
    return keys


def _stamp(path: str) -> Stamp | None:
    try:
        st = os.stat(path)  # follows symlinks: a swapped `..data` resolves to another inode
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class KeyFile:
    """The API keys of one file, replaced by `refresh` when the file changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp = _stamp(path)  # taken before reading: a change while reading shows next time
        self.keys = load_keys(path)

    def refresh(self) -> bool | None:
        """Re-read a changed file: True reloaded, False kept the last good keys, None unchanged.

        A bad version is not read again until the file changes again (one log line per bad
        update, not one per poll)."""
        stamp = _stamp(self.path)
        if stamp == self._stamp:
            return None
        self._stamp = stamp
        try:
            keys = load_keys(self.path)
        except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
            log.warning("Kept last API keys", extra={"file": self.path, "error": str(exc)})
            return False
        self.keys = keys
        log.info("Reloaded API keys", extra={"file": self.path, "keys": len(keys)})
        return True


def bearer(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def tenant_of(
    header: str | None, keys: dict[bytes, str] | None, gateway_tenant: str | None = None
) -> str:
    """The caller's tenant, or ApiError(401) when keys are required and missing or wrong.

    `gateway_tenant` is the value of the configured trusted tenant header, if any."""
    token = bearer(header)
    if keys is None:
        if gateway_tenant:
            return "gw-" + gateway_tenant
        return "bearer-" + _digest(token).hex()[:16] if token else ANONYMOUS
    if token is None:
        raise ApiError(401, "missing API key: send `Authorization: Bearer <key>`")
    digest = _digest(token)
    for known, tenant in keys.items():
        if hmac.compare_digest(known, digest):
            return tenant
    raise ApiError(401, "invalid API key", code="invalid_api_key")
