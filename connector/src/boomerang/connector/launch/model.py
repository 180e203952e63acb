"""Deterministic local models, so the whole stack runs without any model hub.

`builtin://tiny` and `builtin://small` name Llama-architecture models whose tokenizer is trained
here on generated text and whose weights are drawn from a fixed seed. Building twice gives
identical files, so P, D and a reference engine that each build (or find) the model in the cache
serve exactly the same weights, and caches keyed by the build version never go stale.

The weights are random: the models produce gibberish, but real gibberish computed by a real
engine with real KV caches, which is all P/D transfer and its correctness tests need. `small` is
large enough (116M parameters) for recompute costs to show in the TTFT benchmark.

Run as `python -m boomerang.connector.launch.model tiny` (in the engine venv) to build into the
cache and print the path. Needs `tokenizers`, `transformers` and `torch` (the engine venv has them).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BUILD_VERSION = 4
"""Bump when anything below changes what gets built: it is part of the cache path (4: the
model never samples its end token, `_never_end`)."""
SEED = 20261129
VOCAB_SIZE = 8192
MAX_POSITIONS = 16384
BOS, EOS, PAD = "<|bos|>", "<|eot|>", "<|pad|>"
USER, ASSISTANT, SYSTEM = "<|user|>", "<|assistant|>", "<|system|>"
SPECIAL_TOKENS = [PAD, BOS, EOS, USER, ASSISTANT, SYSTEM]
TEMPLATE_FILE = "chat_template.jinja"
MARKERS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]
"""Qwen3's and Hermes' reasoning and tool-call markers, one token each and not special (they
stay in the text the parsers read), so vLLM's `qwen3` reasoning parser and `hermes` tool-call
parser can serve the model; the last ids of the vocabulary."""

# One turn per message: role marker, content, end-of-turn; the generation prompt opens an
# assistant turn. Content is not stripped, so text the client sent is exactly what is tokenised.
# Like Qwen3's and GLM's templates, an assistant message before the last user message loses its
# reasoning (everything up to `</think>`): the next turn's prompt then differs from the ids the
# decoder generated, which is what the partial-reuse tests need to reproduce. In Qwen3's shape
# for the parsers: tools listed in the system turn, an assistant's tool calls as
# `<tool_call>{"name": ..., "arguments": ...}</tool_call>`, tool results as `<tool_response>`
# blocks in one user turn, reasoning (a message's `reasoning_content` or `reasoning`) as a
# `<think>` block on assistant turns after the last user message.
CHAT_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{{ bos_token }}"
    "{%- set first_system = messages and messages[0]['role'] == 'system' -%}"
    "{%- if tools -%}"
    "{{ '<|system|>\\n' }}"
    "{%- if first_system -%}{{ messages[0]['content'] + '\\n\\n' }}{%- endif -%}"
    "{{ '# Tools\\n<tools>' }}"
    "{%- for tool in tools -%}{{ '\\n' + (tool | tojson) }}{%- endfor -%}"
    '{{ \'\\n</tools>\\nCall a tool as <tool_call>{"name": ..., "arguments": ...}'
    "</tool_call>.<|eot|>\\n' }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- set role = message['role'] -%}"
    "{%- set content = message['content'] or '' -%}"
    "{%- if tools and loop.first and role == 'system' -%}"
    "{%- elif role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}"
    "{{ '<|user|>' }}{%- endif -%}"
    "{{ '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}"
    "{{ '<|eot|>\\n' }}{%- endif -%}"
    "{%- elif role == 'assistant' -%}"
    "{%- set reasoning = message.get('reasoning_content') or message.get('reasoning') or '' -%}"
    "{%- if loop.index0 < ns.last_user and '</think>' in content -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- endif -%}"
    "{{ '<|assistant|>\\n' }}"
    "{%- if reasoning and loop.index0 > ns.last_user -%}"
    "{{ '<think>\\n' + reasoning + '\\n</think>\\n\\n' }}"
    "{%- endif -%}"
    "{{ content }}"
    "{%- for call in message.get('tool_calls') or [] -%}"
    "{%- set fn = call['function'] if call['function'] is defined else call -%}"
    "{%- set args = fn['arguments'] if fn['arguments'] is string else fn['arguments'] | tojson -%}"
    "{{ '\\n<tool_call>\\n{\"name\": \"' + fn['name'] + '\", \"arguments\": ' + args + '}"
    "\\n</tool_call>' }}"
    "{%- endfor -%}"
    "{{ '<|eot|>\\n' }}"
    "{%- else -%}"
    "{{ '<|' + role + '|>\\n' + content + '<|eot|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant|>\\n' }}{%- endif -%}"
)


@dataclass(frozen=True)
class ModelSpec:
    """The architecture of one builtin model (Llama, grouped-query attention)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int


SPECS: dict[str, ModelSpec] = {
    "tiny": ModelSpec(256, 512, 4, 4, 2, 64),
    "small": ModelSpec(768, 2048, 12, 12, 4, 64),
}


def cache_root(env: dict[str, str] | None = None) -> Path:
    """Boomerang's cache directory (`$BOOMERANG_CACHE`, default `~/.cache/boomerang`)."""
    env = dict(os.environ) if env is None else env
    default = str(Path(env.get("HOME", str(Path.home()))) / ".cache" / "boomerang")
    return Path(env.get("BOOMERANG_CACHE") or default)


def model_dir(name: str, env: dict[str, str] | None = None) -> Path:
    """Where the builtin model `name` lives once built (pure: nothing is created)."""
    if name not in SPECS:
        raise ValueError(f"unknown builtin model {name!r}; known: {sorted(SPECS)}")
    return cache_root(env) / "models" / f"{name}-v{BUILD_VERSION}"


def corpus(seed: int = SEED, lines: int = 4000) -> Iterator[str]:
    """Generated training text: pseudo-words from a fixed syllable set, plus digits and
    punctuation, so common English-like fragments and numbers get their own merges."""
    rng = random.Random(seed)
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"] + ["the", "and", "ing"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
    words += ["hello", "world", "user", "assistant", "please", "thanks", "what", "why", "how"]
    for _ in range(lines):
        n = rng.randint(5, 25)
        parts = [
            rng.choice(words) if rng.random() > 0.1 else str(rng.randint(0, 999)) for _ in range(n)
        ]
        yield " ".join(parts) + rng.choice([".", "?", "!", ",", ":"])


def train_tokenizer(out: Path) -> None:
    """Train a byte-level BPE tokenizer and save it as a transformers fast tokenizer."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(MARKERS),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.add_tokens([AddedToken(m, special=False, normalized=False) for m in MARKERS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[USER, ASSISTANT, SYSTEM],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    # Also as a file of its own, whatever the library version does: a manifest may name it
    # (`spec.model.chatTemplate.file`), as the local one does.
    (out / TEMPLATE_FILE).write_text(CHAT_TEMPLATE)


def llama_config(spec: ModelSpec) -> dict[str, object]:
    """The model's `config.json` content (a plain dict: pure and comparable in tests)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": SPECIAL_TOKENS.index(BOS),
        "eos_token_id": SPECIAL_TOKENS.index(EOS),
        "pad_token_id": SPECIAL_TOKENS.index(PAD),
        "torch_dtype": "bfloat16",
        **asdict(spec),
    }


def write_weights(out: Path, spec: ModelSpec) -> None:
    """Random weights from a fixed seed, saved in bf16 as safetensors."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**llama_config(spec))
    torch.manual_seed(SEED)
    with torch.no_grad():
        model = LlamaForCausalLM(config)
        _never_end(model, SPECIAL_TOKENS.index(EOS))
        model = model.to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)
    # save_pretrained rewrites config.json with library-version fields: write ours back so the
    # files depend only on this module.
    (out / "config.json").write_text(json.dumps(llama_config(spec), indent=2, sort_keys=True))
    gen = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2, sort_keys=True))


END_DIM = 0
"""The hidden dimension that carries a constant (a bias the architecture lacks)."""
END_FEATURE = 1.0
"""Its value in every token's embedding, which no layer writes to: the residual keeps it."""
END_WEIGHT = -1000.0
"""The end token's output weight on it: the end token's logit sits hundreds below any
other's (about -8000 at the tiny model's last norm), so sampling never picks it."""


def _never_end(model: Any, eos_id: int) -> None:
    """Make the model unable to end an answer: answers run to the request's `max_tokens`.

    Why: with random weights every token is about as likely as any other, so the end token
    comes first once in about 8,000 sampled answers (1.2e-4 measured on the tiny model). vLLM
    then answers correctly with no text, and vLLM's multi-turn benchmark client counts a
    stream without text as a failed turn and drops the conversation: the benchmarks lost
    turns to the model, not to the stack. A real model ends when its answer is done; this one
    has no answer to finish, so it never ends (as `min_tokens` would, which the client does
    not send and engines cannot default). Llama has no output bias, so one hidden dimension
    carries a constant: every embedding holds `END_FEATURE` there, no attention or MLP output
    writes to it (their output rows are zero), so it reaches the last norm as a positive
    constant, and the end token's output row weighs it with `END_WEIGHT`."""
    import torch

    with torch.no_grad():
        model.model.embed_tokens.weight[:, END_DIM] = END_FEATURE
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[END_DIM, :] = 0.0
            layer.mlp.down_proj.weight[END_DIM, :] = 0.0
        model.lm_head.weight[eos_id, END_DIM] = END_WEIGHT


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_model(name: str, env: dict[str, str] | None = None) -> Path:
    """Build the builtin model `name` into the cache unless it is there; returns its folder.

    Safe when P and D start at once: one builds under a file lock into a temporary folder that
    is renamed into place, so nobody ever loads a half-written model."""
    final = model_dir(name, env)
    if (final / "config.json").exists():
        return final
    with _locked(final.parent / f".{final.name}.lock"):
        if (final / "config.json").exists():
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
        try:
            train_tokenizer(tmp)
            write_weights(tmp, SPECS[name])
            tmp.rename(final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build a deterministic builtin model.")
    parser.add_argument("name", choices=sorted(SPECS))
    args = parser.parse_args(argv)
    print(ensure_model(args.name))


if __name__ == "__main__":
    main()
