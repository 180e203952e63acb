"""Tools, reasoning and the chat template: one setting of the model, rendered into both roles'
arguments (P and D must render a prompt identically), mounted where it comes from a ConfigMap,
and part of the engine revision (so P and D of one rendering are paired and rolled together)."""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate
from dd_testing import deployment

from boomerang.operator import render
from boomerang.operator.children import desired_children

K8S_VERSION = "1.36.0"
UID = "0b1e4f9a-0000-4000-8000-000000000001"
PARSERS = {"model": {"toolCallParser": "hermes", "reasoningParser": "qwen3"}}
FROM_CONFIGMAP = {
    "model": {"chatTemplate": {"configMapKeyRef": {"name": "t", "key": "tools.jinja"}}}
}


def statefulsets(patch: dict[str, Any]) -> dict[str, dict[str, Any]]:
    children = desired_children(deployment("minimal", patch, uid=UID))
    return {
        o["metadata"]["name"].rsplit("-", 1)[1]: o for o in children if o["kind"] == "StatefulSet"
    }


def args_of(sts: dict[str, Any]) -> list[str]:
    container: dict[str, Any] = sts["spec"]["template"]["spec"]["containers"][0]
    return list(container["args"])


def after(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_both_roles_get_the_parsers_and_the_render_endpoints() -> None:
    for role, sts in statefulsets(PARSERS).items():
        args = args_of(sts)
        assert after(args, "--tool-call-parser") == "hermes", role
        assert "--enable-auto-tool-choice" in args and after(args, "--reasoning-parser") == "qwen3"
        assert "--enable-scale-out" in args
    none = args_of(statefulsets({})["prefill"])
    assert "--tool-call-parser" not in none and "--reasoning-parser" not in none


def test_a_template_from_a_configmap_key_is_mounted_where_the_engine_reads_it() -> None:
    for role, sts in statefulsets(FROM_CONFIGMAP).items():
        pod = sts["spec"]["template"]["spec"]
        volume = next(v for v in pod["volumes"] if v["name"] == "chat-template")
        assert volume["configMap"] == {
            "name": "t",
            "items": [{"key": "tools.jinja", "path": "tools.jinja"}],
        }
        mount = next(
            m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "chat-template"
        )
        assert mount == {
            "name": "chat-template",
            "mountPath": render.CHAT_TEMPLATE_DIR,
            "readOnly": True,
        }
        path = after(args_of(sts), "--chat-template")
        assert path == f"{render.CHAT_TEMPLATE_DIR}/tools.jinja", role
        kubernetes_validate.validate(json.loads(json.dumps(sts)), K8S_VERSION, strict=True)


def test_a_template_file_in_the_model_is_left_for_the_entrypoint_to_resolve() -> None:
    patch = {"model": {"chatTemplate": {"file": "templates/tool_use.jinja"}}}
    for sts in statefulsets(patch).values():
        assert after(args_of(sts), "--chat-template") == "model://templates/tool_use.jinja"
        assert all(v["name"] != "chat-template" for v in sts["spec"]["template"]["spec"]["volumes"])


def revision(patch: dict[str, Any]) -> str:
    return render.engine_revision(deployment("minimal", patch))


def test_the_rendering_is_part_of_the_engine_revision() -> None:
    base = revision({})
    seen = {base}
    for patch in (PARSERS, FROM_CONFIGMAP, {"model": {"reasoningParser": "deepseek_r1"}}):
        seen.add(revision(patch))
    assert len(seen) == 4
    for sts in statefulsets(PARSERS).values():
        annotations = sts["spec"]["template"]["metadata"]["annotations"]
        assert annotations[render.ANNOTATION_ENGINE_REVISION] == revision(PARSERS)
