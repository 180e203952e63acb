"""The builtin models: where they live, what they are, and that building is deterministic."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from boomerang.connector.launch import engine_venv, model

REPO = Path(__file__).resolve().parents[2]


def test_models_live_in_the_cache_by_name_and_build_version(tmp_path) -> None:
    env = {"BOOMERANG_CACHE": str(tmp_path)}
    assert model.model_dir("tiny", env) == tmp_path / "models" / f"tiny-v{model.BUILD_VERSION}"
    assert model.cache_root({"HOME": "/home/u"}) == Path("/home/u/.cache/boomerang")


def test_unknown_model_is_refused() -> None:
    with pytest.raises(ValueError, match="tiny"):
        model.model_dir("huge", {})


def test_sizes_match_the_documented_architectures() -> None:
    tiny, small = model.llama_config(model.SPECS["tiny"]), model.llama_config(model.SPECS["small"])
    assert (tiny["hidden_size"], tiny["num_hidden_layers"]) == (256, 4)
    assert (small["hidden_size"], small["num_hidden_layers"]) == (768, 12)
    assert tiny["max_position_embeddings"] == 16384


def test_training_text_is_the_same_every_time() -> None:
    assert list(model.corpus(lines=50)) == list(model.corpus(lines=50))


def _engine_python() -> str | None:
    venv = engine_venv.ensure(check=True)
    return str(venv / "bin" / "python") if venv is not None else None


@pytest.mark.engine
def test_building_twice_gives_identical_files(tmp_path) -> None:
    python = _engine_python()
    if python is None:
        if os.environ.get("CI"):
            pytest.fail("engine venv missing under CI")
        pytest.skip("engine venv not installed")
    digests = []
    for run in ("a", "b"):
        env = {**os.environ, "BOOMERANG_CACHE": str(tmp_path / run)}
        cmd = [python, "-m", "boomerang.connector.launch.model", "tiny"]
        out = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE, text=True)
        folder = Path(out.stdout.strip().splitlines()[-1])
        files = sorted(p for p in folder.iterdir() if p.is_file())
        digests.append({p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files})
    assert digests[0] == digests[1]
    assert {"config.json", "tokenizer.json", "model.safetensors"} <= set(digests[0])
    # The chat template is what /v1/chat/completions renders.
    script = (
        "import sys; from transformers import AutoTokenizer; "
        "t = AutoTokenizer.from_pretrained(sys.argv[1]); "
        "print(repr(t.apply_chat_template([{'role': 'user', 'content': 'hi'}], "
        "tokenize=False, add_generation_prompt=True)))"
    )
    out = subprocess.run(
        [python, "-c", script, str(folder)], env=env, check=True, stdout=subprocess.PIPE, text=True
    )
    assert out.stdout.strip().splitlines()[-1] == repr(
        "<|bos|><|user|>\nhi<|eot|>\n<|assistant|>\n"
    )
