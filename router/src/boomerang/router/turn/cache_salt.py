"""Each tenant's prefix cache is its own: vLLM's per-request `cache_salt`, set by the router.

Why it exists: the engines' prefix caches are shared by everyone the router serves, and vLLM
says exactly how many prompt tokens came from its cache (`usage.prompt_tokens_details.
cached_tokens`); the time to first token says it too. Unsalted, a tenant could learn whether
another tenant's prompt prefix (a document, a system prompt) is cached by sending a guess of
it. vLLM mixes a request's `cache_salt` into its first block's hash, and so into every later
one down the chain: requests of two salts share no cached block.

The router gives every turn its tenant's salt. It is derived, not random, so every router
replica gives the same one and a tenant's conversations keep finding their cache across
replicas and restarts. A client's own `cache_salt` (vLLM's field, to split one tenant's
cache further) is mixed in, never passed as it is: no client can name another tenant's salt.
The value sent is a hex digest, within vLLM's rules (at most 128 characters, none of `@`, `/`,
`\\` or NUL). The KV index names a salted prompt's blocks with the same salt (`blockhash.py`),
so KV-aware routing works within each tenant.

`tenant_cache_salt: false` lets tenants share cached prefixes (one long system prompt
computed once for all); then cached-token counts and timings tell each tenant what the others
sent. Pure.
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

FIELD: Final = "cache_salt"
_DOMAIN: Final = b"boomerang-cache-salt\0"


def engine_salt(tenant: str, client_salt: str | None = None) -> str:
    """The salt the engines get for `tenant`'s request (with the client's own, if any)."""
    digest = hashlib.sha256(_DOMAIN + tenant.encode() + b"\0" + (client_salt or "").encode())
    return digest.hexdigest()[:32]


def salt_request(body: dict[str, Any], tenant: str) -> str:
    """Set `body`'s salt to its tenant's (the client's own mixed in); returns it."""
    client = body.get(FIELD)
    body[FIELD] = salt = engine_salt(tenant, client if isinstance(client, str) else None)
    return salt
