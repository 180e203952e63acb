"""Each engine is told its revision, the one its pod template is annotated with, so it can
publish it and the router can pair P and D of one revision during a rollout; an upgrade of
vLLM across releases never pairs engines of two releases."""

from __future__ import annotations

from typing import Any

from dd_testing import deployment

from boomerang.facts.engine import ENGINE_REVISION_ENV, Role
from boomerang.operator import engines, render, revisions
from boomerang.operator.children import desired_children
from boomerang.router.engines.endpoints import Endpoint, pairable, partners


def _revisions(objs: list[dict]) -> dict[str, tuple[str, str]]:  # type: ignore[type-arg]
    """role -> (the pod template's revision annotation, the engine container's env value)."""
    out = {}
    for obj in objs:
        if obj["kind"] != "StatefulSet":
            continue
        template = obj["spec"]["template"]
        env = {e["name"]: e.get("value") for e in template["spec"]["containers"][0]["env"]}
        role = obj["metadata"]["labels"][render.LABEL_ROLE]
        annotation = template["metadata"]["annotations"][render.ANNOTATION_ENGINE_REVISION]
        out[role] = (annotation, env[ENGINE_REVISION_ENV])
    return out


def test_both_engines_are_told_the_revision_their_pods_are_annotated_with() -> None:
    dd = deployment()
    revisions = _revisions(desired_children(dd))
    assert set(revisions) == {"prefill", "decode"}
    for annotation, env in revisions.values():
        assert annotation == env == render.engine_revision(dd)


def test_a_new_engine_image_is_a_new_revision_for_both_roles() -> None:
    before = render.engine_revision(deployment())
    after = deployment(patch={"engine": {"image": "example.org/engine:2"}})
    assert {env for _, env in _revisions(desired_children(after)).values()} == {
        render.engine_revision(after)
    }
    assert render.engine_revision(after) != before


def _pods(dd: Any, role: Role, n: int = 1) -> list[dict[str, Any]]:
    """Pods as a role's template makes them (what the revision reads: their annotations)."""
    template = engines.pod_template(dd, role)
    return [{"metadata": dict(template["metadata"])} for _ in range(n)]


def _endpoint(dd: Any, role: Role, vllm: str) -> Endpoint:
    """The engine as the router learns it: the revision the operator told it to publish
    (`BOOMERANG_ENGINE_REVISION`) and the vLLM version its `/version` answers."""
    return Endpoint(f"http://{role}", role, revision=render.engine_revision(dd), version=vllm)


def test_an_upgrade_from_vllm_0_32_to_0_34_never_pairs_a_p_with_a_d_of_the_other_release() -> None:
    """P rolls first while decode's partition holds its pods on the old image: for that window
    the pods run two engine revisions (the operator reports skew) and the router pairs no P of
    one with a D of the other, whose NIXL connectors (versions 14 and 16) cannot handshake."""
    old = deployment(patch={"engine": {"image": "example.org/connector:vllm-0.32.0"}})
    new = deployment(patch={"engine": {"image": "example.org/connector:vllm-0.34.0"}})
    assert render.engine_revision(old) != render.engine_revision(new)

    rolling = {"observedGeneration": 2, "currentRevision": "a", "updateRevision": "b"}
    prefill = {**engines.build_statefulset(new, "prefill"), "metadata": {"generation": 2}}
    decode = engines.build_statefulset(new, "decode", held=True)
    decode = {**decode, "metadata": {"generation": 2}, "status": rolling}
    prefill["status"] = rolling
    p_revs = revisions.running(prefill, _pods(new, "prefill"))
    d_revs = revisions.running(decode, _pods(old, "decode"))
    assert revisions.skewed(p_revs, d_revs)

    p, d = _endpoint(new, "prefill", "0.34.0"), _endpoint(old, "decode", "0.32.0")
    assert pairable([p], [d]) == [] and partners(p, [d]) == []
    # Even if both published one revision (a role's image overridden by its pod template),
    # the vLLM versions alone keep them apart.
    d.revision = p.revision
    assert pairable([p], [d]) == []
    # Decode rolled: one revision, one release, a pair again.
    rolled = _endpoint(new, "decode", "0.34.0")
    assert not revisions.skewed(p_revs, revisions.running(decode, _pods(new, "decode")))
    assert pairable([p], [rolled]) == [p]
