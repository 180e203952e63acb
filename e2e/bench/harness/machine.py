"""What machine a measurement ran on: CPU model, cores, and the kernels vLLM's CPU build used.

Absolute CPU timings mean little without this: vLLM's x86 CPU build ships three kernel
libraries and loads one by what the CPU offers (AVX-512 with BF16, AVX-512, or AVX2), and the
AVX2 path was seen prefilling tens of times slower. Benchmarks print this line above their
tables so ratios are read as ratios and absolute times against their machine.

`kernel_set` is the same decision vLLM 0.32 makes (`vllm/platforms/cpu.py`, `import_kernels`),
evaluated with the engine venv's own torch by `describe`.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

FEATURES = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
"""The /proc/cpuinfo flags that decide vLLM's CPU kernels and torch's matmul paths."""

_PROBE = (
    "import json, torch; "
    "print(json.dumps([torch.backends.cpu.get_cpu_capability(), "
    "torch.cpu._is_avx512_supported(), torch.cpu._is_avx512_bf16_supported()]))"
)


def kernel_set(avx512: bool, avx512_bf16: bool) -> str:
    """Which of vLLM's x86 kernel libraries loads on a CPU with these features."""
    if avx512 and avx512_bf16:
        return "AVX-512 + BF16 (vllm._C)"
    if avx512:
        return "AVX-512 (vllm._C_AVX512)"
    return "AVX2 (vllm._C_AVX2)"


def cpu_info(text: str) -> tuple[str, list[str]]:
    """The model name and the features of FEATURES present, from /proc/cpuinfo's text."""
    model, flags = "unknown CPU", set[str]()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model == "unknown CPU":
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    return model, [f for f in FEATURES if f in flags]


def describe(engine_venv: Path | None = None) -> str:
    """One line: CPU, cores, features, and (given the engine venv) torch's and vLLM's paths."""
    try:
        model, features = cpu_info(Path("/proc/cpuinfo").read_text())
    except OSError:
        model, features = "unknown CPU", []
    flags = " ".join(features) or "none of " + "/".join(FEATURES)
    line = f"{model}, {os.cpu_count()} cores, flags: {flags}"
    if engine_venv is None:
        return line
    try:
        out = subprocess.run(
            [str(engine_venv / "bin" / "python"), "-c", _PROBE],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            check=True,
            timeout=120,
        ).stdout
        capability, avx512, bf16 = json.loads(out.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return f"{line}; engine kernels unknown"
    return f"{line}; torch CPU capability {capability}; vLLM kernels {kernel_set(avx512, bf16)}"
