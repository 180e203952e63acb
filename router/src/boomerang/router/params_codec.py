"""D's kv_transfer_params as stored in a handle: small, because they are most of its bytes.

A stored conversation must stay under 1 KB with a long history (8k tokens in 128-token blocks:
64 block ids, plus 512 bytes of per-block hashes). Two things make D's params small:
- block ids are stored as differences from the previous id (D's blocks often come in runs of
  consecutive ids, which then compress to almost nothing; scattered ids cost what they did);
- zlib starts from a preset dictionary holding the params' key names and constant values, so
  a few hundred bytes of JSON do not pay for spelling them out once per handle.
zlib with a 2 KiB window is as small as the default for this size but about 5x faster (the
default's 256 KiB of state per call dominated the cost).

The stored form is a JSON array `[params with remote_block_ids null, per-group deltas]`; the
earlier form (a JSON object, compressed without a dictionary; Redis may still hold some) is
read too. `ZDICT` is part of the stored form: changing it makes stored handles unreadable,
which `unpack` reports as ValueError (the turn is then computed without the handle).
"""

from __future__ import annotations

import itertools
import zlib
from typing import Any

import orjson

ZDICT = (
    b'{"do_remote_prefill":false,"do_remote_decode":true,"remote_block_ids":null,'
    b'"remote_engine_id":"","remote_request_id":"cmpl-","remote_host":"","remote_port":5600,'
    b'"tp_size":1,"dcp_size":1,"pp_size":1,"remote_num_tokens":,'
    b'"remote_blocks_expiry_time":,"transfer_mode":"pull","remote_registration_generation":0}'
)


def pack(params: dict[str, Any]) -> bytes:
    """D's params in their stored form (see the module docstring)."""
    groups = params.get("remote_block_ids")
    deltas = None
    if isinstance(groups, list) and all(_ids(g) for g in groups):
        deltas = [[b - a for a, b in zip([0, *g], g, strict=False)] for g in groups]
        params = {**params, "remote_block_ids": None}
    packer = zlib.compressobj(6, zlib.DEFLATED, 11, 4, zdict=ZDICT)
    return packer.compress(orjson.dumps([params, deltas])) + packer.flush()


def unpack(blob: bytes) -> dict[str, Any]:
    """Inverse of `pack`, also for the earlier form; raises ValueError on anything else."""
    try:
        unpacker = zlib.decompressobj(zdict=ZDICT)
        value = orjson.loads(unpacker.decompress(blob) + unpacker.flush())
    except (zlib.error, orjson.JSONDecodeError) as exc:
        raise ValueError(f"unreadable params: {exc}") from None
    if isinstance(value, dict):
        return dict(value)  # the earlier form
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], dict)):
        raise ValueError("unreadable params")
    params: dict[str, Any] = value[0]
    deltas = value[1]
    if deltas is not None:
        if not (isinstance(deltas, list) and all(_deltas(d) for d in deltas)):
            raise ValueError("unreadable block ids")
        params["remote_block_ids"] = [list(itertools.accumulate(d)) for d in deltas]
    return params


def _ids(group: Any) -> bool:
    """A list of block ids small enough that their differences stay 64-bit."""
    return isinstance(group, list) and all(type(i) is int and 0 <= i < 1 << 62 for i in group)


def _deltas(group: Any) -> bool:
    return isinstance(group, list) and all(type(i) is int for i in group)
