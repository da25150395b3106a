"""Build step of the client distribution: the wheel installs the `jobq` namespace only.

The client library imports the pure core as `common.*`, one source shared with the services.
A wheel that installed that `common` as a top-level package would collide with an
application's own `common` (whichever comes first on `sys.path` wins, and `from jobq import
Client` fails). So `build_py` vendors the core into the wheel at build time:

1. it follows the `common` imports of the built `jobq` modules, transitively, to the pure-core
   modules the client needs (never `common.web`, which the client does not import);
2. it copies those modules to `jobq/_core/` and rewrites every `from common… import` of the
   built modules, vendored or not, to `from jobq._core… import`;
3. it fails the build when an import of `common` is left that it cannot rewrite
   (`import common.x`), or when a vendored module would be `common.web`.

The checkout is untouched: the services and the tests import `common` as before. Pip's vendoring
of its own dependencies (`pip/_vendor`, rewritten imports) is the model. The build reads the
sources from the repository root (`package-dir` in pyproject.toml), so only a wheel is
supported; an editable install is refused (it would import `common` from the checkout).
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

CORE = "jobq._core"
"""Where the vendored pure core lives inside the wheel."""

_FROM_COMMON = re.compile(
    r"^(?P<indent>[ \t]*)from[ \t]+common(?P<rest>(?:\.\w+)*)[ \t]+import\b", re.M
)


def _common_imports(source: str, filename: str) -> tuple[set[str], list[int]]:
    """(`common` submodule names `source` imports, lines of `import common…` statements).

    `from common import x` counts `x` as a submodule name; the caller keeps only names that
    are modules of `common`.
    """
    modules: set[str] = set()
    plain: list[int] = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[0] != "common":
                continue
            if len(parts) > 1:
                modules.add(parts[1])
            else:
                modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import) and any(
            alias.name.split(".")[0] == "common" for alias in node.names
        ):
            plain.append(node.lineno)
    return modules, plain


def _rewrite(path: Path) -> set[str]:
    """Rewrite `path`'s `from common… import` lines to `jobq._core`; return the `common`
    submodule names it imported. Raises RuntimeError on an import form left unrewritten."""
    source = path.read_text(encoding="utf-8")
    modules, plain = _common_imports(source, str(path))
    if plain:
        raise RuntimeError(f"{path}:{plain[0]}: write `from common.x import …` (vendoring)")
    rewritten = _FROM_COMMON.sub(lambda m: f"{m['indent']}from {CORE}{m['rest']} import", source)
    left, _ = _common_imports(rewritten, str(path))
    if left:
        raise RuntimeError(f"{path}: imports of common left after rewriting: {sorted(left)}")
    if rewritten != source:
        # Unlink first: the built file may be a hard link to the checkout's source.
        path.unlink()
        path.write_text(rewritten, encoding="utf-8")
    return modules


class VendoringBuildPy(build_py):
    """`build_py` that vendors the pure core into `jobq/_core` (see the module docstring)."""

    def run(self) -> None:
        # A build directory left by an earlier build (say, one that still shipped `common`)
        # would go into the wheel as it is: start from an empty one.
        shutil.rmtree(self.build_lib, ignore_errors=True)
        super().run()
        self._vendored: list[str] = []
        common = Path(self.get_package_dir("common"))
        package = Path(self.build_lib) / "jobq"
        todo = {name for built in package.rglob("*.py") for name in _rewrite(built)}
        core = package / "_core"
        core.mkdir(exist_ok=True)
        (core / "__init__.py").write_text(
            '"""The pure core of jobq (`common` in the repository), vendored at build time."""\n',
            encoding="utf-8",
        )
        self._vendored.append(str(core / "__init__.py"))
        done: set[str] = set()
        while todo:
            name = todo.pop()
            done.add(name)
            if name == "web":
                raise RuntimeError("the client imports common.web, which it must not ship")
            source = common / f"{name}.py"
            if not source.is_file():
                raise RuntimeError(f"the client imports common.{name}, not a module of common")
            target = core / source.name
            target.write_bytes(source.read_bytes())
            self._vendored.append(str(target))
            todo |= _rewrite(target) - done

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), *getattr(self, "_vendored", [])]


class RefuseEditable(editable_wheel):
    """The client distribution installs as a wheel only (its core is vendored at build)."""

    def run(self) -> None:
        raise RuntimeError(
            "the jobq client installs as a wheel (`pip install ./clients/python`); to work on "
            "jobq itself use the repository's environment (`make install`)"
        )


setup(cmdclass={"build_py": VendoringBuildPy, "editable_wheel": RefuseEditable})
