"""Each shared default is defined once, in `boomerang.facts`: the CRD's schema (as the API
server applies it), the router's config, the engine's settings, the lease API's ceiling and the
simulator's settings all carry the value found there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from boomsim.policies import Settings

from boomerang import facts
from boomerang.connector.config import KVTransferSettings
from boomerang.connector.plugin.leases import DEFAULT_CEILING_S
from boomerang.operator.api import DisaggregatedDeployment
from boomerang.router.config import RouterConfig, Tuning

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "boomerang.dev_disaggregateddeployments.yaml"


def crd_kv_transfer() -> dict[str, Any]:
    """The schema of `spec.kvTransfer` in the committed CRD."""
    crd = yaml.safe_load(CRD.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema["properties"]["spec"]["properties"]["kvTransfer"]["properties"]  # type: ignore[no-any-return]


def test_the_crd_schema_defaults_are_the_shared_facts() -> None:
    kv = crd_kv_transfer()
    assert kv["decoderBlocksTTL"]["default"] == f"{facts.DECODER_BLOCKS_TTL_S}s"
    assert kv["recomputeThreshold"]["default"] == facts.RECOMPUTE_THRESHOLD_TOKENS
    assert kv["leaseDuration"]["default"] == f"{facts.LEASE_DURATION_S}s"
    mode = kv["tuning"]["properties"]["mode"]
    assert mode["enum"] == list(facts.SPEC_MODES)
    assert mode["default"] == facts.spec_mode(facts.DEFAULT_MODE)


def test_the_router_config_defaults_are_the_shared_facts() -> None:
    fields = RouterConfig.model_fields
    assert fields["decoder_blocks_ttl_s"].default == facts.DECODER_BLOCKS_TTL_S
    assert fields["recompute_threshold"].default == facts.RECOMPUTE_THRESHOLD_TOKENS
    assert Tuning.model_fields["mode"].default == facts.DEFAULT_MODE
    config = RouterConfig.model_validate(
        {"prefill": {"urls": ["http://p"]}, "decode": {"urls": ["http://d"]}}
    )
    assert config.effective_handle_ttl_s == facts.default_handle_ttl(facts.DECODER_BLOCKS_TTL_S)


def test_the_engine_and_lease_api_defaults_are_the_shared_facts() -> None:
    settings = KVTransferSettings()
    assert settings.decoder_blocks_ttl_s == facts.DECODER_BLOCKS_TTL_S
    assert settings.recompute_threshold == facts.RECOMPUTE_THRESHOLD_TOKENS
    assert settings.lease_duration_s == facts.LEASE_DURATION_S
    assert DEFAULT_CEILING_S == facts.DECODER_BLOCKS_TTL_S


def test_the_simulator_defaults_are_the_shared_facts() -> None:
    settings = Settings(policy="adaptive")
    assert settings.decoder_ttl_s == facts.DECODER_BLOCKS_TTL_S
    assert settings.recompute_threshold == facts.RECOMPUTE_THRESHOLD_TOKENS


def test_a_resource_s_ttl_is_parsed_once_in_whole_seconds_for_engine_router_and_status() -> None:
    """`decoderBlocksTTL: 90.6s` reaches D's engine as 91 s; the router and the status read the
    same 91, so the router never offers blocks past D's deadline."""
    from boomerang.operator import render, status

    manifest = yaml.safe_load((REPO / "examples" / "minimal.yaml").read_text())
    manifest["spec"]["kvTransfer"] = {"decoderBlocksTTL": "90.6s", "leaseDuration": "1m"}
    dd = DisaggregatedDeployment.model_validate(manifest)
    kv = dd.spec.kv_transfer
    assert (kv.decoder_blocks_ttl_s, kv.lease_duration_s) == (91, 60)
    assert render.kv_settings(dd, "decode").decoder_blocks_ttl_s == 91
    assert render.router_config(dd)["decoder_blocks_ttl_s"] == 91
    assert status._effective_kv(dd, None).decoder_blocks_ttl_seconds == 91
    assert dd.spec.router_ttl_seconds == facts.default_handle_ttl(91)


@pytest.mark.parametrize("mode", facts.MODES)
def test_the_two_spellings_of_a_mode_map_onto_each_other(mode: facts.Mode) -> None:
    assert facts.router_mode(facts.spec_mode(mode)) == mode
    assert facts.router_mode(mode) == mode
    with pytest.raises(ValueError, match="tuning mode 'Eager' is none of Static, Adaptive"):
        facts.router_mode("Eager")
