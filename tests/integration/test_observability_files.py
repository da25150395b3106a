"""The observability files pass their own tools: promtool (Debian's `prometheus`, fetched by
`infra.tools` when missing) on both renderings of the Prometheus configuration and on the alert
rules and their unit tests, and `k6 inspect` on every k6 script. (hadolint on the Dockerfile:
tests/unit/test_packaging.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from infra import prometheus_config, tools
from infra.stack import ROOT

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def promtool() -> Path:
    try:
        return tools.ensure("promtool")
    except tools.ToolUnavailable as exc:
        pytest.fail(f"these checks need promtool: {exc}")


def _run(*command: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(c) for c in command], cwd=cwd, capture_output=True, text=True, check=False
    )


def test_compose_prometheus_config_and_its_rules_pass_promtool(promtool: Path) -> None:
    checked = _run(promtool, "check", "config", prometheus_config.COMPOSE_CONFIG)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 1 rule files found" in checked.stdout, "the rules are loaded, not skipped"


def test_local_prometheus_config_passes_promtool(promtool: Path, tmp_path: Path) -> None:
    targets = {job: [f"127.0.0.1:{9000 + i}"] for i, job in enumerate(prometheus_config.JOBS)}
    config = tmp_path / "prometheus.yml"
    config.write_text(prometheus_config.dump(prometheus_config.local(targets)))
    checked = _run(promtool, "check", "config", config)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 1 rule files found" in checked.stdout


def test_alert_rules_pass_promtool_and_their_unit_tests(promtool: Path) -> None:
    rules = sorted(prometheus_config.RULES_DIR.glob("*.yml"))
    checked = _run(promtool, "check", "rules", *rules)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    unit_tests = sorted((prometheus_config.PROMETHEUS_DIR / "tests").glob("*.yml"))
    assert unit_tests, "promtool unit tests exist"
    tested = _run(promtool, "test", "rules", *unit_tests, cwd=unit_tests[0].parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_k6_script_is_valid() -> None:
    scripts = sorted((ROOT / "benchmark" / "k6").glob("*.js"))
    runnable = [s for s in scripts if s.name != "lib.js"]
    assert {s.stem for s in runnable} == {"submit", "mixed", "burst"}
    for script in runnable:
        inspected = _run(BIN / "k6", "inspect", script)
        assert inspected.returncode == 0, inspected.stdout + inspected.stderr
