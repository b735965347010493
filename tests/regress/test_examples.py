"""The CI examples users copy: the pipelines parse and name files that exist, and the
simulated example passes against its committed baseline out of the box."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from typer.testing import CliRunner

from slotune.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
CI = ROOT / "examples" / "ci"


def regress_commands(pipeline: Path) -> list[str]:
    return re.findall(r"slotune regress [^\n;]*", pipeline.read_text())


def test_the_pipelines_parse_and_name_existing_suites() -> None:
    gha = yaml.safe_load((CI / "github-actions.yml").read_text())
    assert set(gha["jobs"]) == {"simulated", "server"}
    gitlab = yaml.safe_load((CI / "gitlab-ci.yml").read_text())
    assert gitlab["slotune-regress-simulated"]["extends"] == ".slotune"
    assert gitlab[".slotune"]["artifacts"]["reports"]["junit"] == "regress-out/junit.xml"
    for pipeline in (CI / "github-actions.yml", CI / "gitlab-ci.yml"):
        commands = regress_commands(pipeline)
        assert any("examples/ci/suite.yaml" in c for c in commands)
        assert any("examples/ci/http-suite.yaml" in c for c in commands)
        for command in commands:
            for path in re.findall(r"examples/ci/[\w.-]+", command):
                assert (ROOT / path).exists() or path.endswith("http-baseline.json"), path


def test_the_simulated_example_passes_against_its_baseline(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        [
            "regress",
            str(CI / "suite.yaml"),
            "--baseline",
            str(CI / "baseline.json"),
            "--out",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "junit.xml").is_file()
