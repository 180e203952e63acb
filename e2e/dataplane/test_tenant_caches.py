"""One tenant's cached prefix is invisible to another (issue 47), through the official
`openai` client, the router and the vLLM CPU decoder: the router salts each tenant's requests
(`cache_salt.py`), so a second tenant sending the first one's long document finds none of it
cached, in the usage it reads back, while the first tenant's next question does. The same
run with salting off shows the leak the salt closes (the test can fail).

The data plane's P runs without a prefix cache (the published setup), so the router runs
decode-first with a threshold no prompt reaches: every turn runs on D alone, whose prefix cache
serves it and whose own count is the usage the client gets."""

from __future__ import annotations

import random
import uuid

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

DOC_WORDS = 500


def _cached(router: str, model: str, key: str, doc: str, question: str) -> int:
    """The prompt tokens the engines say came from their cache, for `key`'s tenant."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{router}/v1", api_key=key)
    resp = client.chat.completions.create(
        model=model,
        messages=[{"role": "system", "content": doc}, {"role": "user", "content": question}],
        max_tokens=4,
        temperature=0.0,
    )
    details = resp.usage.prompt_tokens_details if resp.usage else None
    return int(details.cached_tokens or 0) if details else 0


def _document(seed: int) -> str:
    rng = random.Random(seed)
    vocabulary = [
        "harbour",
        "tide",
        "lantern",
        "ledger",
        "copper",
        "orchard",
        "meridian",
        "sable",
        "quarry",
        "vellum",
    ]
    return " ".join(rng.choice(vocabulary) + str(rng.randrange(100)) for _ in range(DOC_WORDS))


@pytest.mark.parametrize("salted", [True, False], ids=["salted", "shared"])
def test_a_tenant_cannot_see_what_another_tenant_cached(dataplane, salted: bool) -> None:
    router = dataplane.router(
        f"router-tenants-{salted}",
        tenant_cache_salt=salted,
        bidirectional=False,
        decode_first_tokens=1_000_000,  # every turn on D alone, from D's prefix cache
    )
    doc = _document(4700 + salted)
    a, b = f"tenant-a-{uuid.uuid4()}", f"tenant-b-{uuid.uuid4()}"
    _cached(router, dataplane.model, a, doc, "Which word comes first?")
    again = _cached(router, dataplane.model, a, doc, "Which word comes last?")
    other = _cached(router, dataplane.model, b, doc, "Which word comes first?")
    assert again >= 128, again  # the same tenant's next question: the document, cached
    if salted:
        assert other == 0, other  # the other tenant: nothing of it, not even its first block
    else:
        assert other >= 128, other  # without the salt the count tells tenant b what a sent
