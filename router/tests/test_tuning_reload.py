"""The `tuning` section: its validation, and its hot reload from the config file while the
router runs (a valid change applies to the next turn, an invalid one is counted and ignored,
any other key needs a restart)."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError
from router_testing import chat, post
from test_paths import Frozen, Recorder, conversation

from boomerang.router.apis.protocol import CONTINUE_PARAMS
from boomerang.router.app import ROUTER
from boomerang.router.config import RouterConfig, Tuning
from boomerang.router.learning.costmodel import DEFAULT_PRIORS
from boomerang.router.metrics import Metrics
from boomerang.router.tuning import TuningReload

BASE: dict[str, Any] = {
    "prefill": {"urls": ["http://10.0.0.1:8000"]},
    "decode": {"urls": ["http://10.0.0.2:8000"]},
}


def write(path: Path, **fields: Any) -> None:
    path.write_text(yaml.safe_dump({**BASE, **fields}))


def reload_of(tmp_path: Path, **fields: Any) -> tuple[RouterConfig, TuningReload, Metrics]:
    path = tmp_path / "router.yaml"
    write(path, **fields)
    config = RouterConfig.load(path)
    metrics = Metrics()
    return config, TuningReload(config, metrics), metrics


def reloads(metrics: Metrics, result: str) -> float:
    return float(metrics.tuning_reloads.labels(result)._value.get())


def test_tuning_defaults_to_adaptive_and_checks_its_bounds() -> None:
    config = RouterConfig.model_validate(BASE)
    assert config.tuning == Tuning()
    assert config.tuning.mode == "adaptive" and config.lease_token_file is None
    with pytest.raises(ValidationError, match="break_even_min_tokens"):
        Tuning(break_even_min_tokens=10, break_even_max_tokens=5)
    with pytest.raises(ValidationError):
        Tuning.model_validate({"mode": "Adaptive"})
    with pytest.raises(ValidationError):
        Tuning.model_validate({"decode_memory_budget": 0})
    with pytest.raises(ValidationError):
        Tuning.model_validate({"continue_max_suffix_tokens": -1})
    with pytest.raises(ValidationError):
        Tuning.model_validate({"unknown": 1})
    loaded = RouterConfig.model_validate({**BASE, "lease_token_file": "/etc/boomerang/lease"})
    assert str(loaded.lease_token_file) == "/etc/boomerang/lease"


def test_the_rendered_yaml_round_trips() -> None:
    config = RouterConfig.model_validate({**BASE, "tuning": {"mode": "adaptive"}})
    again = RouterConfig.model_validate(config.model_dump(mode="json", exclude_none=True))
    assert again.tuning == config.tuning
    assert config.source_path is None


def test_a_valid_change_applies_and_an_unchanged_file_is_a_no_op(tmp_path: Path) -> None:
    config, reload, metrics = reload_of(tmp_path)
    assert config.source_path == tmp_path / "router.yaml"
    assert reload.check() is None
    write(tmp_path / "router.yaml", tuning={"mode": "adaptive", "itl_budget_s": 0.2})
    assert reload.check() is True
    assert config.tuning.mode == "adaptive" and config.tuning.itl_budget_s == 0.2
    assert reload.check() is None
    assert (reloads(metrics, "ok"), reloads(metrics, "error")) == (1, 0)
    write(tmp_path / "router.yaml")  # the section removed: back to the defaults
    assert reload.check() is True and config.tuning == Tuning()


@pytest.mark.parametrize(
    "content",
    [
        "tuning: {mode: fast}\n",
        "tuning: {break_even_min_tokens: 9, break_even_max_tokens: 3}\n",
        "tuning: [unclosed\n",
        "- a list\n",
    ],
    ids=["bad mode", "bounds out of order", "not yaml", "not a mapping"],
)
def test_an_invalid_change_keeps_the_last_tuning(tmp_path: Path, caplog: Any, content: str) -> None:
    config, reload, metrics = reload_of(tmp_path, tuning={"mode": "adaptive"})
    (tmp_path / "router.yaml").write_text(content)
    with caplog.at_level(logging.WARNING, logger="boomerang.router"):
        assert reload.check() is False
    assert config.tuning.mode == "adaptive"
    assert (reloads(metrics, "ok"), reloads(metrics, "error")) == (0, 1)
    assert "Kept last tuning" in caplog.messages
    write(tmp_path / "router.yaml", tuning={"mode": "static"})  # a later valid one applies
    assert reload.check() is True and config.tuning.mode == "static"


def test_other_keys_need_a_restart(tmp_path: Path, caplog: Any) -> None:
    config, reload, _ = reload_of(tmp_path, listen_port=8080)
    write(tmp_path / "router.yaml", listen_port=9090, tuning={"mode": "adaptive"})
    with caplog.at_level(logging.WARNING, logger="boomerang.router"):
        assert reload.check() is True
    assert config.listen_port == 8080 and config.tuning.mode == "adaptive"
    (record,) = [r for r in caplog.records if r.message == "Config changed, restart to apply"]
    assert record.keys == ["listen_port"]


def test_a_kubelet_symlink_swap_is_picked_up(tmp_path: Path) -> None:
    """A mounted ConfigMap: the file is a symlink into `..data`, swapped atomically."""
    first = tmp_path / "..2026_01_01"
    first.mkdir()
    write(first / "router.yaml")
    (tmp_path / "..data").symlink_to(first.name)
    (tmp_path / "router.yaml").symlink_to("..data/router.yaml")
    config, reload, _ = RouterConfig.load(tmp_path / "router.yaml"), None, None
    reload = TuningReload(config, Metrics())
    second = tmp_path / "..2026_01_02"
    second.mkdir()
    write(second / "router.yaml", tuning={"mode": "adaptive"})
    (tmp_path / "..data_tmp").symlink_to(second.name)
    os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
    assert reload.check() is True and config.tuning.mode == "adaptive"


async def test_the_poller_applies_a_change_while_running(tmp_path: Path) -> None:
    config, reload, _ = reload_of(tmp_path, tuning_poll_s=0.02)
    task = asyncio.create_task(reload.run())
    try:
        write(tmp_path / "router.yaml", tuning_poll_s=0.02, tuning={"mode": "adaptive"})
        for _ in range(200):
            if config.tuning.mode == "adaptive":
                break
            await asyncio.sleep(0.01)
        assert config.tuning.mode == "adaptive"
    finally:
        task.cancel()


async def test_a_reloaded_tuning_applies_to_the_next_turn(world: Any, tmp_path: Path) -> None:
    """A static router pulls; once the file says adaptive, the next turn continues on D."""
    w = await world()
    router = w.client.server.app[ROUTER]
    router.retention = Recorder()
    router.paths.model = Frozen(DEFAULT_PRIORS)
    path = tmp_path / "router.yaml"
    write(path)
    reload = TuningReload(router.config, router.metrics, path)
    messages = await conversation(w, 2)
    assert all(c["kv_transfer_params"] != CONTINUE_PARAMS for c in w.decode[0].calls)
    write(path, tuning={"mode": "adaptive"})
    assert reload.check() is True
    status, _ = await post(w, chat(messages, conversation_id="c"))
    assert status == 200
    assert w.decode[0].calls[-1]["kv_transfer_params"] == CONTINUE_PARAMS
    assert router.state()["mode"] == "adaptive"
