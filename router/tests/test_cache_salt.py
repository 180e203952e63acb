"""Each tenant's prefix cache is its own (`cache_salt.py`, issue 47): every engine call of a
turn carries its tenant's salt, a client's own salt is mixed in and never passed on, a bad
one gets the API's 400 naming the field, and the KV index names salted blocks (`blockhash.py`,
`kvevents.py`) so routing by what an engine holds works within each tenant."""

from __future__ import annotations

from typing import Any

import pytest
from fake_kv_publisher import stored
from router_testing import chat, post
from test_responses_and_messages import MESSAGES, RESPONSES, call, messages_body, responses_body

from boomerang.router.auth import ANONYMOUS, tenant_of
from boomerang.router.engines import blockhash
from boomerang.router.engines.kvevents import Index
from boomerang.router.metrics import Metrics
from boomerang.router.turn.cache_salt import engine_salt

URL, BS = "http://d0", 16
IDS = list(range(1, 65))  # four blocks
SALT = engine_salt("acme")


def test_a_tenants_salt_is_stable_its_own_and_within_vllms_rules() -> None:
    assert engine_salt("acme") == engine_salt("acme")  # every replica gives the same
    assert engine_salt("acme") != engine_salt("globex")
    assert engine_salt("acme", "mine") not in (engine_salt("acme"), engine_salt("globex", "mine"))
    # a client cannot reach another tenant's salt by naming it as its own
    assert engine_salt("globex", engine_salt("acme")) != engine_salt("acme")
    salt = engine_salt("a/b@c\\d")
    assert 0 < len(salt) <= 128 and not set(salt) & set("@/\\\0")


def test_a_salted_chain_differs_in_every_block_and_verifies_with_its_salt() -> None:
    plain, salted = blockhash.prompt_hashes(IDS, BS), blockhash.prompt_hashes(IDS, BS, salt=SALT)
    assert len(salted) == 4 and not set(plain) & set(salted)  # the first block's salt carries on
    assert blockhash.verify_stored(salted, IDS, BS, salt=SALT)
    assert not blockhash.verify_stored(salted, IDS, BS)
    assert not blockhash.verify_stored(salted, IDS, BS, salt=engine_salt("globex"))


def _index(*events: dict[str, Any]) -> Index:
    index = Index(None, Metrics())
    index.engines.bit(URL)
    index.apply(URL, [0.0, list(events), 0])
    return index


def _held(index: Index, salt: str | None) -> int:
    return index.cached_tokens(index.hashes(IDS, salt), [URL]).get(URL, 0)


def test_the_index_names_a_salted_prompt_within_its_tenant_only() -> None:
    index = _index(stored(IDS[:32], BS, salt=SALT), stored(IDS, BS, first=2, salt=SALT))
    assert index.usable  # the salted chain was checked against the router's own hashing
    assert _held(index, SALT) == 64
    assert _held(index, engine_salt("globex")) == 0 and _held(index, None) == 0


def test_a_salted_event_hashed_otherwise_makes_the_index_unusable() -> None:
    event = stored(IDS, BS, salt=SALT)
    event["extra_keys"] = [[engine_salt("globex")], None, None, None]  # not what it hashed
    assert not _index(event).usable


@pytest.mark.parametrize(
    "change",
    [
        {"lora_name": "adapter"},
        {"extra_keys": [["mm-hash", 0], None, None, None]},  # a multimodal input's pair
        {"extra_keys": [[SALT], ["mm-hash", 0], None, None]},  # one further down the chain
    ],
)
def test_blocks_of_other_extra_keys_are_not_named(change: dict[str, Any]) -> None:
    index = _index({**stored(IDS, BS, salt=SALT), **change})
    assert index.usable and _held(index, SALT) == 0


def _salts(w: Any) -> list[Any]:
    """The salt of every completion call each engine got (a call without one: None)."""
    return [c.get("cache_salt") for e in (*w.prefill, *w.decode) for c in e.calls]


async def test_every_engine_call_of_a_turn_carries_its_tenants_salt(world: Any) -> None:
    w = await world()
    status, body = await post(w, chat([{"role": "user", "content": "hi"}]))
    assert status == 200, body
    assert _salts(w) and set(_salts(w)) == {engine_salt(ANONYMOUS)}  # P's call and D's

    for e in (*w.prefill, *w.decode):
        e.calls.clear()
    status, _ = await post(w, chat([{"role": "user", "content": "hi"}]), Authorization="Bearer k")
    assert status == 200
    assert set(_salts(w)) == {engine_salt(tenant_of("Bearer k", None))}
    assert engine_salt(tenant_of("Bearer k", None)) != engine_salt(ANONYMOUS)


async def test_a_clients_own_salt_is_mixed_in_never_passed_on(world: Any) -> None:
    w = await world()
    status, _ = await post(w, chat([{"role": "user", "content": "hi"}], cache_salt="mine"))
    assert status == 200
    assert set(_salts(w)) == {engine_salt(ANONYMOUS, "mine")}


@pytest.mark.parametrize("path", [RESPONSES, MESSAGES])
async def test_the_agent_apis_carry_the_salt_too(world: Any, path: str) -> None:
    w = await world()
    body = (responses_body if path == RESPONSES else messages_body)(
        [{"role": "user", "content": "hello there"}]
    )
    status, answer = await call(w, path, body)
    assert status == 200, answer
    assert _salts(w) and set(_salts(w)) == {engine_salt(ANONYMOUS)}


@pytest.mark.parametrize("bad", ["", "a/b", "x" * 129, 7])
async def test_a_bad_salt_gets_the_apis_400_naming_the_field(world: Any, bad: Any) -> None:
    w = await world()
    status, body = await post(w, chat([{"role": "user", "content": "hi"}], cache_salt=bad))
    assert status == 400
    assert body["error"]["param"] == "cache_salt", body
    assert _salts(w) == []  # no engine was called


async def test_salting_off_shares_the_cache_and_passes_a_clients_salt(world: Any) -> None:
    w = await world(tenant_cache_salt=False)
    status, _ = await post(w, chat([{"role": "user", "content": "hi"}]))
    assert status == 200
    assert set(_salts(w)) == {None}
    status, _ = await post(w, chat([{"role": "user", "content": "hi"}], cache_salt="mine"))
    assert status == 200
    assert "mine" in _salts(w)
