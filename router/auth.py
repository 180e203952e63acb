"""Who is calling: optional Bearer API keys, and the tenant that scopes conversations.

With an API keys file (one `key [tenant]` per line, `#` comments), a request without a listed
key gets 401, and its tenant is the one named on the key's line (or one derived from the key).
Without a file, anyone may call; the tenant is derived from whatever Bearer token is sent (a
gateway in front may authenticate), else a shared anonymous tenant. Keys are held only as
SHA-256 digests, so neither logs nor memory dumps show them.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

from boomerang.router.errors import ApiError

ANONYMOUS = "anonymous"


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
