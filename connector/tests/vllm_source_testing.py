"""Reads a vLLM release's Python sources out of its wheel, without installing or importing it.

Why: GPU vLLM imports only with its CUDA dependencies, which a CPU machine does not have, so the
per-version test (`test_vllm_versions.py`) checks the plugin's patch points (`vllm_points`) on
the sources with `ast`: it resolves a dotted name the way Python would find it (top-level
definitions, re-exports through `from ... import`, simple aliases, inherited class members) and
reads what the plugin assumes of it (positional parameters, async generator, attributes set in
`__init__`, a constant's value, keyword arguments its body passes). Also: which fields vLLM's
argument classes declare (the engine arguments `config.py` renders) and which
`kv_connector_extra_config` keys the NIXL connector reads.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from boomerang.connector.plugin.vllm_points import Point, matches

Definition = ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef | ast.Assign | ast.AnnAssign
MAX_DEPTH = 12
"""Re-exports and base classes followed before giving up (a cycle, or a very deep chain)."""


def download(version: str, cache: Path) -> Path:
    """vLLM `version`'s wheel (`pip download --no-deps`), cached in `cache/<version>/`."""
    folder = cache / version
    found = sorted(folder.glob(f"vllm-{version}-*.whl"))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--disable-pip-version-check", "-q", "-d", str(folder), f"vllm=={version}"]
    subprocess.run(cmd, check=True)
    return sorted(folder.glob(f"vllm-{version}-*.whl"))[0]


@dataclass(frozen=True)
class Found:
    module: str
    node: Definition


class WheelSource:
    """The `vllm/**.py` files of one wheel, parsed on demand."""

    def __init__(self, wheel: Path) -> None:
        self._zip = zipfile.ZipFile(wheel)
        self.files = {n for n in self._zip.namelist() if n.endswith(".py")}
        self._trees: dict[str, ast.Module | None] = {}

    def file_of(self, module: str) -> str | None:
        base = module.replace(".", "/")
        for name in (f"{base}.py", f"{base}/__init__.py"):
            if name in self.files:
                return name
        return None

    def tree(self, module: str) -> ast.Module | None:
        if module not in self._trees:
            name = self.file_of(module)
            self._trees[module] = ast.parse(self._zip.read(name)) if name else None
        return self._trees[module]

    # --- resolving names -----------------------------------------------------------------------

    def lookup(self, module: str, name: str, depth: int = 0) -> Found | None:
        """A module's top-level `name`: defined there, or imported or aliased into it."""
        tree = self.tree(module)
        if tree is None or depth > MAX_DEPTH:
            return None
        for node in _top_level(tree.body):
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                if node.name == name:
                    return Found(module, node)
            elif isinstance(node, ast.Assign | ast.AnnAssign) and name in _targets(node):
                if isinstance(node.value, ast.Name) and node.value.id != name:
                    return self.lookup(module, node.value.id, depth + 1)  # an alias
                return Found(module, node)
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        source = _absolute(module, node, self.file_of(module))
                        return self.lookup(source, alias.name, depth + 1)
        return None

    def find(self, module: str, dotted: str) -> Found | None:
        """`module.dotted`, e.g. a method through the class that defines or inherits it."""
        head, *rest = dotted.split(".")
        found = self.lookup(module, head)
        for part in rest:
            if found is None or not isinstance(found.node, ast.ClassDef):
                return None
            found = self.member(found, part)
        return found

    def member(self, cls: Found, name: str, depth: int = 0) -> Found | None:
        for klass in self.mro(cls, depth):
            assert isinstance(klass.node, ast.ClassDef)
            for node in klass.node.body:
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
                    return Found(klass.module, node)
                if isinstance(node, ast.Assign | ast.AnnAssign) and name in _targets(node):
                    return Found(klass.module, node)
        return None

    def mro(self, cls: Found, depth: int = 0) -> list[Found]:
        """The class and the bases found in these sources, depth first (enough for lookups)."""
        assert isinstance(cls.node, ast.ClassDef)
        out = [cls]
        if depth > MAX_DEPTH:
            return out
        for base in cls.node.bases:
            dotted = ast.unparse(base)
            found = self.lookup(cls.module, dotted.split(".")[-1]) if dotted else None
            if found is not None and isinstance(found.node, ast.ClassDef):
                out += [k for k in self.mro(found, depth + 1) if k not in out]
        return out

    def classes_named(self, name: str) -> list[Found]:
        """Every class of this name anywhere in the package (for ones that move between
        modules from release to release, such as the front end's argument class)."""
        out = []
        needle = f"class {name}".encode()
        for file in sorted(self.files):
            if needle not in self._zip.read(file):
                continue
            module = file.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
            found = self.lookup(module, name)
            if found is not None and isinstance(found.node, ast.ClassDef):
                out.append(found)
        return out

    # --- checking ------------------------------------------------------------------------------

    def check(self, point: Point) -> str | None:
        """None when these sources have `point` as described, else what differs (the same
        questions `vllm_points.check` asks of an imported vLLM)."""
        if not point.name:
            return None if self.file_of(point.module) else "no such module"
        found = self.find(point.module, point.name)
        if found is None:
            return "absent"
        node = found.node
        if point.value is not None:
            value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
            if not isinstance(value, ast.Constant) or value.value != point.value:
                return f"is {ast.unparse(value) if value else '?'}, not {point.value!r}"
        if point.params is not None or point.async_generator or point.passes:
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                return "not a function"
            if point.params is not None and not matches(names := positional(node), point):
                return f"takes ({', '.join(names)})"
            if point.async_generator and not _is_async_generator(node):
                return "not an async generator"
            absent = [k for k in point.passes if k not in passed_keywords(node)]
            if absent:
                return f"passes no {', '.join(absent)}="
        if point.attributes:
            if not isinstance(node, ast.ClassDef):
                return "not a class"
            absent = [a for a in point.attributes if a not in self.init_sets(found)]
            if absent:
                return f"__init__ sets no {', '.join(absent)}"
        return None

    def init_sets(self, cls: Found) -> set[str]:
        """`self.<name>` assigned in the `__init__` of the class or of a base."""
        names: set[str] = set()
        for klass in self.mro(cls):
            assert isinstance(klass.node, ast.ClassDef)
            for node in klass.node.body:
                if isinstance(node, ast.FunctionDef) and node.name == "__init__":
                    names |= _self_stores(node)
        return names

    def fields(self, cls: Found) -> set[str]:
        """The annotated class-level fields of a (data)class and of its bases."""
        names: set[str] = set()
        for klass in self.mro(cls):
            assert isinstance(klass.node, ast.ClassDef)
            for node in klass.node.body:
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    names.add(node.target.id)
        return names

    def extra_config_keys(self, package: str) -> set[str]:
        """The string keys passed to `get_from_extra_config(...)` anywhere in `package`."""
        prefix = package.replace(".", "/") + "/"
        keys: set[str] = set()
        for file in self.files:
            if not file.startswith(prefix):
                continue
            for node in ast.walk(ast.parse(self._zip.read(file))):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "get_from_extra_config"
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                ):
                    keys.add(str(node.args[0].value))
        return keys


def positional(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    return [a.arg for a in (*node.args.posonlyargs, *node.args.args)]


def passed_keywords(node: ast.AST) -> set[str]:
    return {
        kw.arg for call in ast.walk(node) if isinstance(call, ast.Call) for kw in call.keywords
    } - {None}  # type: ignore[operator]


def _is_async_generator(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return isinstance(node, ast.AsyncFunctionDef) and any(
        isinstance(n, ast.Yield | ast.YieldFrom) for n in ast.walk(node)
    )


def _self_stores(func: ast.FunctionDef) -> set[str]:
    names = set()
    for node in ast.walk(func):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
        ):
            names.add(node.attr)
    return names


def _targets(node: ast.Assign | ast.AnnAssign) -> set[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return {t.id for t in targets if isinstance(t, ast.Name)}


def _top_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """A module's statements, with those inside top-level `if` and `try` blocks (conditional
    imports and definitions) after the plain ones."""
    out: list[ast.stmt] = []
    nested: list[ast.stmt] = []
    for node in body:
        if isinstance(node, ast.If):
            nested += _top_level(node.body) + _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            nested += _top_level(node.body)
        else:
            out.append(node)
    return out + nested


def _absolute(module: str, node: ast.ImportFrom, file: str | None) -> str:
    """The module a `from ... import` names, relative imports made absolute."""
    if not node.level:
        return node.module or ""
    package = module if file and file.endswith("__init__.py") else module.rsplit(".", 1)[0]
    for _ in range(node.level - 1):
        package = package.rsplit(".", 1)[0]
    return f"{package}.{node.module}" if node.module else package
