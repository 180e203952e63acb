"""Each engine is told its revision, the one its pod template is annotated with, so it can
publish it and the router can pair P and D of one revision during a rollout."""

from __future__ import annotations

from dd_testing import deployment

from boomerang.connector.config import ENGINE_REVISION_ENV
from boomerang.operator import render
from boomerang.operator.children import desired_children


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
