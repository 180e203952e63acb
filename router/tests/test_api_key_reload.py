"""API keys follow their file: a rotated key works within seconds, without a restart.

The Kubernetes way is tested as the kubelet does it for a mounted Secret: the key file is a
symlink into `..data`, itself a symlink to a timestamped directory; an update writes a new
directory and renames a new `..data` over the old one.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from boomerang.router.auth import KeyFile

POLL = {"api_keys_poll_s": 0.05}


class SecretVolume:
    """A directory laid out like a mounted Secret with one key, `keys`."""

    def __init__(self, root: Path, text: str) -> None:
        self.root, self.version = root, 0
        self.write(text)
        (root / "keys").symlink_to("..data/keys")

    @property
    def path(self) -> str:
        return str(self.root / "keys")

    def write(self, text: str | bytes) -> None:
        self.version += 1
        new = self.root / f"..2026_01_01_00_00_{self.version:02d}.000"
        new.mkdir()
        data = text.encode() if isinstance(text, str) else text
        (new / "keys").write_bytes(data)
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(new.name)
        os.replace(tmp, self.root / "..data")  # the atomic swap
        old = self.root / f"..2026_01_01_00_00_{self.version - 1:02d}.000"
        if old.exists():
            (old / "keys").unlink()
            old.rmdir()


async def status(w: Any, key: str) -> int:
    resp = await w.client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
    return int(resp.status)


async def until_status(w: Any, key: str, want: int, timeout_s: float = 3.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while (got := await status(w, key)) != want:
        assert asyncio.get_running_loop().time() < deadline, f"{key}: {got}, not {want}"
        await asyncio.sleep(0.02)


async def until_metric(w: Any, result: str, value: float, timeout_s: float = 3.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    name = "boomerang_router_api_key_reloads_total"
    while await w.metric(name, result=result) < value:
        assert asyncio.get_running_loop().time() < deadline, f"{name}{{{result}}} < {value}"
        await asyncio.sleep(0.02)


async def test_a_rewritten_keys_file_takes_effect_without_restart(
    world: Any, tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("old-key tenant-a\n")
    w = await world(api_keys_file=str(keys), **POLL)
    assert await status(w, "old-key") == 200
    keys.write_text("new-key-2 tenant-a\n")
    await until_status(w, "new-key-2", 200)
    assert await status(w, "old-key") == 401
    assert await w.metric("boomerang_router_api_key_reloads_total", result="ok") == 1


async def test_a_secret_update_by_symlink_swap_takes_effect(world: Any, tmp_path: Path) -> None:
    volume = SecretVolume(tmp_path, "key-one tenant-a\n")
    w = await world(api_keys_file=volume.path, **POLL)
    assert await status(w, "key-one") == 200
    volume.write("key-two tenant-a\n")  # same size: only the inode says it changed
    await until_status(w, "key-two", 200)
    assert await status(w, "key-one") == 401


async def test_a_bad_update_keeps_the_last_good_keys(world: Any, tmp_path: Path) -> None:
    volume = SecretVolume(tmp_path, "good-key\n")
    w = await world(api_keys_file=volume.path, **POLL)
    for errors, bad in enumerate((b"# emptied by mistake\n", b"\xff\xfe not text\n"), start=1):
        volume.write(bad)
        await until_metric(w, "error", errors)
        assert await status(w, "good-key") == 200
    volume.write("next-key\n")  # a good update after bad ones is taken
    await until_status(w, "next-key", 200)
    assert await status(w, "good-key") == 401
    assert await w.metric("boomerang_router_api_key_reloads_total", result="error") == 2


def test_a_vanished_file_keeps_the_keys_and_is_read_again_when_back(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("a\n")
    keys = KeyFile(str(path))
    first = keys.keys
    assert keys.refresh() is None  # unchanged: nothing read
    path.unlink()
    assert keys.refresh() is False and keys.keys == first
    assert keys.refresh() is None  # the same failure is reported once, not on every poll
    path.write_text("b tenant-b\n")
    assert keys.refresh() is True
    assert list(keys.keys.values()) == ["tenant-b"]
