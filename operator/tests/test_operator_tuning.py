"""Adaptive tuning through the operator: the API's defaults, the router's `tuning` section, a
tuning change that restarts no pod, and what the router learned reaching status."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from dd_testing import deployment
from test_reconcile import NOW, MemoryKube, body

from boomerang.operator import render, routing, tuning
from boomerang.operator.api import DisaggregatedDeploymentStatus
from boomerang.operator.children import desired_children
from boomerang.operator.reconcile import StatusGate, reconcile, refresh_status
from boomerang.router.config import RouterConfig

LATER = "2026-01-01T00:00:30Z"
ADAPTIVE = {"kvTransfer": {"tuning": {"mode": "Adaptive"}}}
STATE = {
    "mode": "adaptive",
    "break_even_tokens": 912.4,
    "retention_s": 143.0,
    "paths": {"pull": 10, "recompute": 3, "continue": 37},
    "retained_blocks": 120,
    "retained_fraction": 0.314,
    "coefficients": {"p_compute_s_per_token": 0.0002},
    "slo": {"scale": 5.0, "tpot_s": 0.0371, "ttft_s": {"1000": 0.8304, "8000": 6.2}},
}


def _router_yaml(objs: list[dict[str, Any]]) -> dict[str, Any]:
    config_map = next(o for o in objs if o["kind"] == "ConfigMap")
    loaded: dict[str, Any] = yaml.safe_load(config_map["data"][render.ROUTER_CONFIG_KEY])
    return loaded


def _templates(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        o["metadata"]["name"]: o["spec"]["template"]
        for o in objs
        if o["kind"] in ("StatefulSet", "Deployment")
    }


def test_adaptive_is_the_default_with_the_documented_bounds() -> None:
    t = deployment().spec.kv_transfer.tuning
    assert t.mode == "Adaptive"
    assert (t.break_even.min_tokens, t.break_even.max_tokens) == (0, 1_000_000)
    assert t.continue_on_decode.enabled and t.continue_on_decode.max_suffix_tokens == 8192
    assert t.continue_on_decode.itl_budget is None  # derived by the router per decoder
    assert t.slo.enabled and t.slo.scale == 5 and t.slo.ttft is None and t.slo.tpot is None
    assert (t.retention.quantile_percent, t.retention.minimum) == (90, "10s")
    assert t.decode_memory_budget_percent == 50


def test_the_router_gets_its_tuning_section_in_its_own_names_and_units() -> None:
    dd = deployment(
        patch={
            "kvTransfer": {
                "tuning": {
                    "mode": "Adaptive",
                    "breakEven": {"minTokens": 64, "maxTokens": 4096},
                    "continueOnDecode": {
                        "enabled": False, "maxSuffixTokens": 256, "itlBudget": "20ms"
                    },
                    "retention": {
                        "quantilePercent": 95, "minimum": "1m", "reuseReleased": False
                    },
                    "decodeMemoryBudgetPercent": 30,
                    "slo": {"enabled": False, "scale": 3, "ttft": "2s", "tpot": "50ms"},
                }
            }
        }
    )  # fmt: skip
    assert render.router_config(dd)["tuning"] == {
        "mode": "adaptive",
        "break_even_min_tokens": 64,
        "break_even_max_tokens": 4096,
        "continue_on_decode": False,
        "continue_max_suffix_tokens": 256,
        "itl_budget_s": 0.02,
        "slo_aware": False,
        "slo_scale": 3,
        "ttft_slo_s": 2.0,
        "tpot_slo_s": 0.05,
        "retention_quantile": 0.95,
        "retention_min_s": 60.0,
        "reuse_released": False,
        "decode_memory_budget": 0.3,
    }
    loaded = RouterConfig.model_validate(render.router_config(dd)).tuning
    assert loaded.mode == "adaptive" and loaded.itl_budget_s == 0.02
    assert (loaded.slo_aware, loaded.ttft_slo_s, loaded.tpot_slo_s) == (False, 2.0, 0.05)


def test_the_default_tuning_is_the_router_s_own_default() -> None:
    """Nothing set renders exactly what a router with no tuning section runs (adaptive)."""
    rendered = RouterConfig.model_validate(render.router_config(deployment())).tuning
    config = render.router_config(deployment())
    config.pop("tuning")
    assert RouterConfig.model_validate(config).tuning == rendered


@pytest.mark.parametrize(
    "change",
    [
        {"kvTransfer": {"tuning": {"mode": "Static"}}},
        {"kvTransfer": {"tuning": {"retention": {"minimum": "30s", "quantilePercent": 99}}}},
        {"kvTransfer": {"tuning": {"continueOnDecode": {"enabled": False}}}},
        {"kvTransfer": {"tuning": {"decodeMemoryBudgetPercent": 10}}},
    ],
    ids=["mode", "retention", "continue", "budget"],
)
def test_a_tuning_change_updates_the_config_map_and_restarts_no_pod(change: Any) -> None:
    before = desired_children(deployment(uid="u-1"))
    after = desired_children(deployment(patch=change, uid="u-1"))
    assert _templates(after) == _templates(before)  # router and both engine roles
    assert _router_yaml(after)["tuning"] != _router_yaml(before)["tuning"]
    untuned = {k: v for k, v in _router_yaml(after).items() if k != "tuning"}
    assert untuned == {k: v for k, v in _router_yaml(before).items() if k != "tuning"}


def test_what_the_router_reads_only_at_start_still_restarts_it() -> None:
    before = routing.build_deployment(deployment())
    after = routing.build_deployment(deployment(patch={"kvTransfer": {"recomputeThreshold": 9}}))
    annotation = render.ANNOTATION_CONFIG_HASH
    old = before["spec"]["template"]["metadata"]["annotations"][annotation]
    assert after["spec"]["template"]["metadata"]["annotations"][annotation] != old


def test_the_router_state_maps_to_rounded_status_fields() -> None:
    assert tuning.learned(STATE) == {
        "breakEvenTokens": 912,
        "retentionSeconds": 143,
        "pathShares": {"pull": 20, "recompute": 6, "continue": 74},
        "retainedBlocks": 120,
        "retainedPercent": 31,
        "tpotBoundMilliseconds": 37,
        "ttftBoundMillisecondsAt1kTokens": 830,
    }


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ({"mode": "static", "break_even_tokens": 64}, None),  # not reloaded yet
        ([1, 2], None),
        ("adaptive", None),
        ({"mode": "adaptive"}, {}),
        ({"mode": "adaptive", "paths": {"pull": 0, "recompute": 0, "continue": 0}}, {}),
        ({"mode": "adaptive", "paths": {"pull": 2}}, {"pathShares": {
            "pull": 100, "recompute": 0, "continue": 0}}),
        ({"mode": "adaptive", "paths": {"pull": "2"}}, {}),
        ({"mode": "adaptive", "break_even_tokens": None, "retention_s": float("nan")}, {}),
        ({"mode": "adaptive", "retained_blocks": True, "retention_s": -1}, {}),
        ({"mode": "adaptive", "retained_fraction": 1.2}, {"retainedPercent": 100}),
        ({"mode": "adaptive", "slo": None}, {}),  # chosen without bounds
        ({"mode": "adaptive", "slo": {"tpot_s": "fast", "ttft_s": [1]}}, {}),
        ({"mode": "adaptive", "slo": {"ttft_s": {"1000": 2}}}, {
            "ttftBoundMillisecondsAt1kTokens": 2000}),
    ],
    ids=["static", "a-list", "a-string", "nothing-learned", "no-turns", "one-path",
         "a-count-as-text", "null-and-nan", "bool-and-negative", "fraction-above-one",
         "no-slo", "slo-malformed", "slo-ttft-only"],
)  # fmt: skip
def test_a_partial_or_odd_state_leaves_out_what_it_does_not_say(
    state: Any, expected: dict[str, Any] | None
) -> None:
    assert tuning.learned(state) == expected


def test_observed_at_moves_only_when_a_value_changes() -> None:
    values = tuning.learned(STATE)
    first = tuning.in_force(None, values, NOW)
    assert first["observedAt"] == NOW
    status = {"kvTransfer": {"mode": "Adaptive", **first}}
    assert tuning.in_force(status, dict(values or {}), LATER) == first  # unchanged: no write
    moved = tuning.in_force(status, {**(values or {}), "retainedBlocks": 7}, LATER)
    assert moved["observedAt"] == LATER and moved["retainedBlocks"] == 7
    assert tuning.in_force(status, None, LATER) == first  # nothing reported since a restart


def _kv(kube: MemoryKube) -> dict[str, Any]:
    kv: dict[str, Any] = kube.owner["status"]["kvTransfer"]
    return kv


def test_static_status_says_the_mode_and_nothing_learned() -> None:
    data = body()
    data["spec"].setdefault("kvTransfer", {})["tuning"] = {"mode": "Static"}
    kube = MemoryKube(data)
    gate = StatusGate()
    reconcile(kube.owner, kube, NOW, gate)
    refresh_status(kube.owner, kube, NOW, gate, learned=tuning.learned(STATE))
    kv = _kv(kube)
    assert kv["mode"] == "Static"
    assert not set(kv) & {*tuning.LEARNED_FIELDS, tuning.OBSERVED_AT}
    assert gate.learned == {}


def _adaptive_body() -> dict[str, Any]:
    data = body()
    data["spec"]["kvTransfer"] = copy.deepcopy(ADAPTIVE["kvTransfer"])
    return data


def test_what_the_router_learned_reaches_status_and_is_written_only_on_change() -> None:
    kube = MemoryKube(_adaptive_body())
    kube.ready = True
    gate = StatusGate()
    reconcile(kube.owner, kube, NOW, gate)
    assert _kv(kube)["mode"] == "Adaptive" and "breakEvenTokens" not in _kv(kube)
    writes = len(kube.status_writes)
    outcome = refresh_status(kube.owner, kube, NOW, gate, learned=tuning.learned(STATE))
    assert outcome.written and len(kube.status_writes) == writes + 1
    kv = _kv(kube)
    assert kv["breakEvenTokens"] == 912 and kv["retentionSeconds"] == 143
    assert kv["pathShares"] == {"pull": 20, "recompute": 6, "continue": 74}
    assert kv["retainedBlocks"] == 120 and kv["observedAt"] == NOW
    # The same report later, a full reconcile, a workload event: nothing to write.
    again = refresh_status(kube.owner, kube, LATER, gate, learned=tuning.learned(STATE))
    assert not again.written
    assert not reconcile(kube.owner, kube, LATER, gate).written
    assert not refresh_status(kube.owner, kube, LATER, gate).written
    # An operator restarted (a new gate) keeps what status says until its first report.
    assert not reconcile(kube.owner, kube, LATER, StatusGate()).written
    assert _kv(kube)["observedAt"] == NOW


def test_switching_back_to_static_drops_the_learned_values() -> None:
    kube = MemoryKube(_adaptive_body())
    gate = StatusGate()
    reconcile(kube.owner, kube, NOW, gate)
    refresh_status(kube.owner, kube, NOW, gate, learned=tuning.learned(STATE))
    kube.owner["spec"]["kvTransfer"]["tuning"]["mode"] = "Static"
    reconcile(kube.owner, kube, LATER, gate)
    kv = _kv(kube)
    assert kv["mode"] == "Static" and "breakEvenTokens" not in kv and "observedAt" not in kv


def test_the_learned_status_is_exactly_the_status_model_of_the_api() -> None:
    kube = MemoryKube(_adaptive_body())
    gate = StatusGate()
    reconcile(kube.owner, kube, NOW, gate)
    refresh_status(kube.owner, kube, NOW, gate, learned=tuning.learned(STATE))
    status = kube.owner["status"]
    parsed = DisaggregatedDeploymentStatus.model_validate(status)
    assert parsed.model_dump(by_alias=True, exclude_none=True) == status
    assert set(tuning.LEARNED_FIELDS) <= set(status["kvTransfer"])


def test_clients_retention_hints_are_capped_by_max_client_ttl() -> None:
    retention = {"retention": {"maxClientTTL": "2m"}}
    dd = deployment(patch={"kvTransfer": {"tuning": retention}})
    assert render.router_config(dd)["tuning"]["retention_max_client_s"] == 120.0
    loaded = RouterConfig.model_validate(render.router_config(dd)).tuning
    assert loaded.retention_max_client_s == 120.0
    for unset in ({}, {"retention": {"maxClientTTL": "0s"}}):  # the router's default
        config = render.router_config(deployment(patch={"kvTransfer": {"tuning": unset}}))
        assert "retention_max_client_s" not in config["tuning"]


def test_session_headers_render_into_the_router_s_config() -> None:
    assert "session_headers" not in render.router_config(deployment())
    dd = deployment(patch={"router": {"sessionHeaders": ["x-my-session"]}})
    config = render.router_config(dd)
    assert config["session_headers"] == ["x-my-session"]
    assert RouterConfig.model_validate(config).session_headers == ["x-my-session"]
    none = render.router_config(deployment(patch={"router": {"sessionHeaders": []}}))
    assert RouterConfig.model_validate(none).session_headers == []


@pytest.mark.parametrize("on", [True, False])
def test_carrying_streams_over_and_tenant_caches_render_into_the_router_s_config(on: bool) -> None:
    default = RouterConfig.model_validate(render.router_config(deployment()))
    assert default.migrate_streams and default.tenant_cache_salt  # both on unless turned off
    dd = deployment(patch={"router": {"migrateStreams": on, "isolateTenantCaches": on}})
    config = render.router_config(dd)
    assert (config["migrate_streams"], config["tenant_cache_salt"]) == (on, on)
    loaded = RouterConfig.model_validate(config)
    assert (loaded.migrate_streams, loaded.tenant_cache_salt) == (on, on)


@pytest.mark.parametrize("grace", [None, 15, 600])
def test_a_router_pod_s_grace_period_covers_its_prestop_and_its_drain(grace: int | None) -> None:
    from boomerang.operator import routing

    patch = {"router": {"terminationGracePeriodSeconds": grace}} if grace else {}
    dd = deployment(patch=patch)
    pod = routing.build_deployment(dd)["spec"]["template"]["spec"]
    expected = grace or 120
    assert pod["terminationGracePeriodSeconds"] == expected
    (container,) = pod["containers"]
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    drain = RouterConfig.model_validate(render.router_config(dd)).shutdown_drain_s
    assert drain == expected - 10  # preStop 5 s, exit margin 5 s


def test_a_router_grace_period_too_short_to_drain_is_refused() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"terminationGracePeriodSeconds|termination_grace"):
        deployment(patch={"router": {"terminationGracePeriodSeconds": 10}})
