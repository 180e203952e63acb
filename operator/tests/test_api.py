"""The API model accepts the samples and rejects bad specs with messages that name the field."""

from __future__ import annotations

from typing import Any

import pytest
from dd_testing import EXAMPLES, INVALID, deployment, invalid_manifest, manifest, rule_for
from pydantic import ValidationError

from boomerang.operator.api import (
    MAX_DURATION_NS,
    MAX_NAME_LENGTH,
    NAME_RULES,
    RULES,
    DisaggregatedDeployment,
    duration_ns,
    parse_duration,
)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_sample_is_valid(path: Any) -> None:
    deployment(path.stem)


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c["name"])
def test_bad_spec_is_rejected_naming_the_field(case: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as err:
        DisaggregatedDeployment.model_validate(invalid_manifest(case))
    text = str(err.value)
    # pydantic names nested fields by their wire (camelCase) path, rules by their full path.
    leaf = case["field"].rsplit(".", 1)[-1]
    assert case["field"] in text or leaf in text, text
    assert case.get("message", "") in text, text
    rule = rule_for(case)
    assert rule is None or rule.message in text, text  # the rule's own message, whole


def test_every_rule_has_an_invalid_case() -> None:
    messages = []
    for case in INVALID:
        try:
            DisaggregatedDeployment.model_validate(invalid_manifest(case))
        except ValidationError as exc:
            messages.append(str(exc))
    for rule in (*NAME_RULES, *RULES):
        assert any(rule.message in m for m in messages), f"no invalid case for: {rule.message}"


def test_the_longest_name_children_fit_is_admitted_and_one_more_is_not() -> None:
    # a DNS label (63) less the prefill StatefulSet's suffix and its pods' `-<int32 ordinal>`
    assert MAX_NAME_LENGTH == 44
    for length, admitted in ((MAX_NAME_LENGTH, True), (MAX_NAME_LENGTH + 1, False)):
        data = manifest("minimal")
        data["metadata"]["name"] = "a" * length
        try:
            DisaggregatedDeployment.model_validate(data)
        except ValidationError as exc:
            assert not admitted and "metadata.name must be at most" in str(exc)
        else:
            assert admitted


def test_defaults_follow_vllm_and_the_issue() -> None:
    spec = deployment("minimal").spec
    assert spec.kv_transfer.bidirectional is True
    assert spec.kv_transfer.recompute_threshold == 64
    assert parse_duration(spec.kv_transfer.decoder_blocks_ttl) == 480
    assert parse_duration(spec.kv_transfer.lease_duration) == 30
    assert spec.kv_transfer.load_failure_policy == "recompute"
    assert spec.router.replicas == 2
    assert spec.backend == "UCX"


def test_efa_selects_libfabric_by_default() -> None:
    assert deployment("qwen3-32b-p5en-efa").spec.backend == "LIBFABRIC"


def test_router_ttl_defaults_below_decoder_ttl_with_margin() -> None:
    spec = deployment("minimal").spec
    assert 0 < spec.router_ttl_seconds < 480 - 5
    short = deployment("minimal", {"kvTransfer": {"decoderBlocksTTL": "60s"}}).spec
    assert 0 < short.router_ttl_seconds < 60 - 5


@pytest.mark.parametrize(
    ("text", "seconds"), [("480s", 480), ("8m", 480), ("1h30m", 5400), ("250ms", 0.25)]
)
def test_durations_parse_like_cel(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("1.5h", 5_400_000_000_000),
        ("0.1s", 100_000_000),
        ("1.0000000001s", 1_000_000_000),  # beyond nanoseconds: dropped, as Go does
        ("29s999ms", 29_999_000_000),
        ("99999h99999m99999s99999ms", ((99999 * 60 + 99999) * 60 + 99999) * 10**9 + 99999 * 10**6),
    ],
)
def test_durations_count_nanoseconds_like_go(text: str, ns: int) -> None:
    assert duration_ns(text) == ns


@pytest.mark.parametrize("text", ["2562047h47m16.854775808s", "100000s", "1h1m1s1ms1h"])
def test_durations_past_four_parts_of_five_digits_are_invalid(text: str) -> None:
    with pytest.raises(ValueError, match="up to four numbers of at most five digits"):
        duration_ns(text)


def test_the_longest_duration_the_pattern_admits_is_far_below_gos_limit() -> None:
    assert duration_ns("99999.999999999h99999.9h99999.9h99999.9h") < MAX_DURATION_NS // 6


def test_wire_names_are_camel_case_with_kubernetes_acronyms() -> None:
    dumped = deployment("minimal").model_dump(by_alias=True)
    assert "decoderBlocksTTL" in dumped["spec"]["kvTransfer"]
    assert "conversationTTL" in dumped["spec"]["router"]
    assert "hugepages2Mi" in dumped["spec"]["prefill"]["resources"]


def test_unknown_spec_fields_are_rejected() -> None:
    data = manifest("minimal")
    data["spec"]["prefil"] = {"replicas": 2}
    with pytest.raises(ValidationError, match="prefil"):
        DisaggregatedDeployment.model_validate(data)
