"""Generated DisaggregatedDeployments for property tests, and what must hold of every admitted one.

`manifests()` draws whole resources from the CRD schema that `crdgen` derives from the pydantic
model, so a new field is generated without a change here: integers at and just past their
bounds, strings at their length limits, durations near the rules' limits (the router's TTL and
retention's minimum against the decoder's TTL), names around the longest the children allow.
Each draw is within the schema's bounds but for up to two fields set around them (past a bound,
a broken pattern, the wrong type), so that a stray value meets an otherwise valid resource, as
a user's typo does.

`check_builds` is admission's promise to the operator: a resource the model admits is turned by
the builders into children whose names and labels Kubernetes accepts.
"""

from __future__ import annotations

import functools
import re
import string
from collections.abc import Mapping
from typing import Any

from hypothesis import strategies as st

from boomerang.connector import config
from boomerang.operator import api, crdgen, render
from boomerang.operator.children import desired_children
from boomerang.router.config import RouterConfig

JSON = dict[str, Any]

DURATIONS = [
    "0s", "0ms", "1ms", "999ms", "0.999s", "1s", "5s", "29s999ms", "30s", "0.5m", "60s", "55s",
    "474.999s", "475s", "480s", "8m", "1h30m", "1.5h",
    "2562047h", "2562047h47m16.854775807s", "2562048h",  # the longest Go duration, and past it
]  # fmt: skip
NOT_DURATIONS = ["", "8 minutes", "-1s", "1us", "1d", "s"]
NOT_MODEL_SOURCES = ["hf://Qwen/Qwen 3", "hf://Qwen3-0.6B", "builtin://huge", "pvc:///m", "ftp://x"]
QUANTITIES: list[Any] = ["0", "1", 2, "500m", "16Gi", "1.5", ".5", "1e3", "-1"]
NOT_QUANTITIES = ["", "lots", "1.5.5", "Gi"]
_UNITS = ("ms", "s", "m", "h")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def _durations() -> st.SearchStrategy[str]:
    part = st.tuples(
        st.integers(0, 10_000), st.one_of(st.just(""), st.integers(0, 999).map(lambda f: f".{f}"))
    )
    composed = st.lists(st.tuples(part, st.sampled_from(_UNITS)), min_size=1, max_size=3).map(
        lambda parts: "".join(f"{n}{frac}{unit}" for (n, frac), unit in parts)
    )
    return st.one_of(st.sampled_from(DURATIONS), composed)


def _integers(node: JSON) -> st.SearchStrategy[int]:
    low, high = node.get("minimum", -4), node.get("maximum", 2**63 - 1)
    near = [n for n in (low, low + 1, low + 2, 4, 8, high - 1, high) if low <= n <= high]
    return st.one_of(st.sampled_from(near), st.integers(low, min(low + 8, high)))


def _strings(node: JSON) -> st.SearchStrategy[str]:
    low, high = node.get("minLength", 0), node.get("maxLength")
    alphabet = string.ascii_lowercase + string.digits + "-./:"
    values = st.text(alphabet, min_size=max(low, 1), max_size=12)
    return values if high is None else st.one_of(values, st.just("x" * high))


def _free_form() -> st.SearchStrategy[JSON]:
    """Untyped JSON, where the schema keeps unknown fields; keys cannot name a typed field."""
    keys = st.text("xyz", max_size=3)
    leaves = st.one_of(st.none(), st.booleans(), st.integers(-2, 2), st.text("ab", max_size=3))
    values = st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=2) | st.dictionaries(keys, inner, max_size=2),
        max_leaves=4,
    )
    return st.dictionaries(keys, values, max_size=2)


def _object(node: JSON) -> st.SearchStrategy[Any]:
    fields = {k: from_schema(v) for k, v in node.get("properties", {}).items()}
    required = set(node.get("required", []))
    typed: st.SearchStrategy[JSON] = st.fixed_dictionaries(
        {k: v for k, v in fields.items() if k in required},
        optional={k: v for k, v in fields.items() if k not in required},
    )
    if node.get("x-kubernetes-preserve-unknown-fields"):
        extra = st.one_of(st.just({}), _free_form())
        return st.tuples(extra, typed).map(lambda pair: {**pair[0], **pair[1]})
    if "additionalProperties" in node:
        keys = st.text(string.ascii_lowercase + "./-", min_size=1, max_size=8)
        return st.dictionaries(keys, from_schema(node["additionalProperties"]), max_size=2)
    return typed


def from_schema(node: JSON) -> st.SearchStrategy[Any]:
    """Values one node of the CRD schema admits, its bounds included."""
    if node.get("x-kubernetes-int-or-string"):
        return st.sampled_from(QUANTITIES)
    if "enum" in node:
        return st.sampled_from(node["enum"])
    kind = node.get("type")
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        return _integers(node)
    if kind == "string":
        if node.get("pattern") == api.DURATION_RE:
            return _durations()
        if "pattern" in node:
            return st.from_regex(node["pattern"], fullmatch=True)
        return _strings(node)
    if kind == "array":
        return st.lists(from_schema(node.get("items", {})), max_size=2)
    return _object(node)


def around(node: JSON) -> st.SearchStrategy[Any]:
    """Values just past one node's bounds, and of the wrong type (what users get wrong)."""
    wrong = st.one_of(st.just("x"), st.just(1), st.builds(list), st.builds(dict))
    past: list[Any] = []
    if node.get("x-kubernetes-int-or-string"):
        past = NOT_QUANTITIES
    elif "enum" in node:
        past = ["Bogus"]
    elif node.get("type") == "integer":
        past = [node.get("minimum", 0) - 1, node.get("maximum", 2**63 - 1) + 1]
    elif node.get("pattern") == api.DURATION_RE:
        past = NOT_DURATIONS
    elif "pattern" in node:
        past = ["ftp://x", ""]
    elif node.get("type") == "string":
        past = [""] + (["x" * (node["maxLength"] + 1)] if "maxLength" in node else [])
    return st.one_of(st.sampled_from(past), wrong) if past else wrong


Path = tuple[str | int, ...]


def _paths(node: JSON, path: Path = ()) -> list[tuple[Path, JSON]]:
    """Every node of a schema, by path (0 stands for an array's first item)."""
    found = [(path, node)] if path else []
    for key, sub in node.get("properties", {}).items():
        found += _paths(sub, (*path, key))
    if "items" in node:
        found += _paths(node["items"], (*path, 0))
    return found


def _set(data: Any, path: Path, value: Any) -> Any:
    """A copy of `data` with `path` set to `value`, creating what is missing on the way."""
    if not path:
        return value
    key, rest = path[0], path[1:]
    if isinstance(key, int):
        items = list(data) if isinstance(data, list) and data else [{}]
        return [_set(items[0], rest, value), *items[1:]]
    mapping = dict(data) if isinstance(data, dict) else {}
    return {**mapping, key: _set(mapping.get(key), rest, value)}


def names() -> st.SearchStrategy[str]:
    """Names within and around what the children allow: DNS labels near MAX_NAME_LENGTH,
    and names the API server admits as object names but Services do not."""
    labels = st.from_regex(r"[a-z]([-a-z0-9]*[a-z0-9])?", fullmatch=True)
    longest = st.integers(api.MAX_NAME_LENGTH - 2, api.MAX_NAME_LENGTH + 2).flatmap(
        lambda n: st.text("ab1-", min_size=n - 2, max_size=n - 2).map(lambda mid: f"d{mid}0")
    )
    odd = st.sampled_from(["minimal.v2", "2minimal", "Minimal", "a", "a-b", "a" * 64])
    return st.one_of(labels, longest, odd)


def _near_router_ttl_bound(spec: JSON, delta_ns: int) -> JSON:
    """The router's TTL put at the decoder's TTL minus 5s minus `delta_ns` (the rule's bound)."""
    decoder = spec.get("kvTransfer", {}).get("decoderBlocksTTL", "480s")
    try:
        ttl = api.duration_ns(decoder) - 5 * api.NS_PER_S - delta_ns
    except ValueError:
        return spec
    if ttl < 0:
        return spec
    seconds, ns = divmod(ttl, api.NS_PER_S)
    router = {**spec.get("router", {}), "conversationTTL": f"{seconds}.{ns:09d}s"}
    return {**spec, "router": router}


def _near_retention_bound(spec: JSON, delta_ns: int) -> JSON:
    """Retention's minimum put at the decoder's TTL plus `delta_ns` (its ceiling)."""
    kv = spec.get("kvTransfer", {})
    try:
        minimum = api.duration_ns(kv.get("decoderBlocksTTL", "480s")) + delta_ns
    except ValueError:
        return spec
    seconds, ns = divmod(max(minimum, 0), api.NS_PER_S)
    tuning = kv.get("tuning", {})
    retention = {**tuning.get("retention", {}), "minimum": f"{seconds}.{ns:09d}s"}
    return {**spec, "kvTransfer": {**kv, "tuning": {**tuning, "retention": retention}}}


_SPEC_SCHEMA = crdgen.openapi_schema(api.DisaggregatedDeploymentSpec)
_STRAY_FIELDS = st.sampled_from([(path, around(node)) for path, node in _paths(_SPEC_SCHEMA)])


@functools.cache
def _specs() -> st.SearchStrategy[JSON]:
    return from_schema(_SPEC_SCHEMA)


def model_sources() -> st.SearchStrategy[str]:
    """Sources of every shape the API admits (a CEL rule checks them, not a schema pattern),
    and now and then one it refuses."""
    admitted = st.from_regex(config.MODEL_SOURCE_RE, fullmatch=True)
    return st.one_of(admitted, admitted, admitted, st.sampled_from(NOT_MODEL_SOURCES))


@st.composite
def manifests(draw: st.DrawFn) -> JSON:
    """Whole resources as a user would write them (wire names, defaults mostly left out): one
    within the schema's bounds, then up to two of its fields set around theirs."""
    spec = draw(_specs())
    spec = _set(spec, ("model", "source"), draw(model_sources()))
    delta = draw(st.one_of(st.none(), st.sampled_from([-(10**6), 0, 10**6])))
    if delta is not None:
        spec = _near_router_ttl_bound(spec, delta)
    delta = draw(st.one_of(st.none(), st.sampled_from([-(10**6), 0, 10**6])))
    if delta is not None:
        spec = _near_retention_bound(spec, delta)
    for _ in range(draw(st.integers(0, 2))):
        path, values = draw(_STRAY_FIELDS)
        spec = _set(spec, path, draw(values))
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": draw(names())},
        "spec": spec,
    }


def check_builds(dd: api.DisaggregatedDeployment) -> None:
    """The builders run on an admitted resource, and every child's name and labels fit."""
    RouterConfig.model_validate(render.router_config(dd))  # what the router will load
    for held in (False, True):
        for obj in desired_children(dd, decode_held=held):
            _check_fits(dd, obj)


def _check_fits(dd: api.DisaggregatedDeployment, obj: Mapping[str, Any]) -> None:
    kind, name = obj["kind"], obj["metadata"]["name"]
    assert name in {dd.name + suffix for suffix in api.CHILD_SUFFIXES}, (kind, name)
    if kind in ("Service", "StatefulSet"):
        assert len(name) <= 63 and _DNS_LABEL.fullmatch(name), (kind, name)
        assert name[0].isalpha(), f"{kind} {name}: older Kubernetes wants DNS-1035 labels"
    else:
        assert len(name) <= 253 and _DNS_SUBDOMAIN.fullmatch(name), (kind, name)
    if kind == "StatefulSet":
        last_ordinal = obj["spec"]["replicas"] - 1
        pod = f"{name}-{last_ordinal}"  # also the pod's hostname and its pod-name label
        revision = f"{name}-{'h' * 10}"  # the controller-revision-hash label StatefulSets add
        assert len(pod) <= 63 and len(revision) <= 63, (pod, revision)
    ours = set(render.labels(dd, "any"))
    for labels in _label_sets(obj):
        for key, value in labels.items():
            if key in ours:
                assert len(value) <= 63 and _LABEL_VALUE.fullmatch(value), (kind, key, value)


def _label_sets(node: Any) -> list[Mapping[str, Any]]:
    """Every `labels`/`matchLabels` mapping in an object, and matchExpressions' values."""
    found: list[Mapping[str, Any]] = []
    if isinstance(node, Mapping):
        for key, value in node.items():
            if key in ("labels", "matchLabels") and isinstance(value, Mapping):
                found.append(value)
            elif key == "matchExpressions":
                found += [{e["key"]: v} for e in value for v in e.get("values", [])]
            else:
                found += _label_sets(value)
    elif isinstance(node, list):
        for item in node:
            found += _label_sets(item)
    return found
