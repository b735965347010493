"""`slotune regress` end to end on the simulator: exit codes, the named metric, reports."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

from slotune.cli.app import app
from tests.regress.conftest import sim_suite, write

JUDGED = {
    ("chat", "ttft_ms.p99"),
    ("chat", "output_throughput"),
    ("chat", "slo_attainment"),
    ("burst", "e2el_ms.mean"),  # its own tolerances replace the defaults
}


def invoke(*args: str | Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["regress", *map(str, args)])
    assert "Traceback" not in result.output
    return result.exit_code, result.output


@pytest.fixture()
def baseline(tmp_path: Path, tiny_trace: Path) -> Path:
    suite = write(tmp_path, "suite.yaml", sim_suite(tiny_trace))
    code, output = invoke("baseline", suite, "--out", tmp_path / "base.json")
    assert code == 0, output
    return tmp_path / "base.json"


def junit_cases(path: Path) -> dict[tuple[str, str], ET.Element]:
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    cases = suite.findall("testcase")
    # the attributes the common (Jenkins/Ant junit-10.xsd) schema requires
    assert {"name", "tests", "failures", "errors", "time"} <= set(suite.attrib)
    for case in cases:
        assert {"name", "classname"} <= set(case.attrib)
        for failure in case.findall("failure"):
            assert {"message", "type"} <= set(failure.attrib)
    assert int(suite.get("tests", "-1")) == len(cases)
    assert int(suite.get("failures", "-1")) == sum(c.find("failure") is not None for c in cases)
    return {(c.get("classname", "").removeprefix("regress."), c.get("name", "")): c for c in cases}


def test_an_identical_run_exits_0_with_every_case_passing(
    tmp_path: Path, tiny_trace: Path, baseline: Path
) -> None:
    suite = write(tmp_path, "suite.yaml", sim_suite(tiny_trace))
    code, output = invoke(suite, "--baseline", baseline, "--out", tmp_path / "cur")
    assert code == 0, output
    assert "regressed" not in output
    cases = junit_cases(tmp_path / "cur" / "junit.xml")
    assert set(cases) == JUDGED
    assert all(c.find("failure") is None for c in cases.values())
    assert (tmp_path / "cur" / "results.json").is_file()


def test_a_worse_configuration_exits_1_and_names_the_metric(
    tmp_path: Path, tiny_trace: Path, baseline: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    step_summary = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
    worse = sim_suite(tiny_trace, config="{max_num_batched_tokens: 256, max_num_seqs: 1}")
    suite = write(tmp_path, "worse.yaml", worse)
    code, output = invoke(suite, "--baseline", baseline, "--out", tmp_path / "cur")
    assert code == 1, output
    assert "regression: chat: ttft_ms.p99 rose" in output
    cases = junit_cases(tmp_path / "cur" / "junit.xml")
    assert set(cases) == JUDGED
    failed = {key for key, case in cases.items() if case.find("failure") is not None}
    assert ("chat", "ttft_ms.p99") in failed
    assert {key for key in failed if key[0] == "burst"} == set()  # its config did not change
    message = cases[("chat", "ttft_ms.p99")].find("failure").get("message", "")  # type: ignore[union-attr]
    assert message.startswith("ttft_ms.p99 rose")
    summary = step_summary.read_text()
    assert "regression(s)" in summary
    assert "| chat | ttft_ms.p99 |" in summary and "**regressed**" in summary


def test_run_then_compare_matches_the_one_step_command(
    tmp_path: Path, tiny_trace: Path, baseline: Path
) -> None:
    suite = write(tmp_path, "suite.yaml", sim_suite(tiny_trace))
    code, output = invoke("run", suite, "--out", tmp_path / "cur")
    assert code == 0, output
    junit = tmp_path / "j" / "cases.xml"
    code, output = invoke(
        "compare", "--baseline", baseline, "--current", tmp_path / "cur", "--junit", junit
    )
    assert code == 0, output
    assert set(junit_cases(junit)) == JUDGED


MALFORMED = [
    ("benchmarks:\n  - name: a\n    lod: {rate: 1}\n", "3", "benchmarks[0].lod", "not a known key"),
    (
        "benchmarks:\n  - name: a\n    tolerances:\n      ttft_ms.p99: 10%\n",
        "4",
        "benchmarks[0].tolerances.ttft_ms.p99",
        "'10%' is not valid; expected +10% (higher is worse)",
    ),
    (
        "benchmarks:\n  - name: a\n    tolerances: {ttft: +1%}\n",
        "3",
        "benchmarks[0].tolerances.ttft",
        "unknown metric 'ttft'",
    ),
    (
        "benchmarks:\n  - name: a\n    load: {rate: 0}\n    tolerances: {goodput: -1%}\n",
        "3",
        "benchmarks[0].load.rate",
        "must be greater than 0",
    ),
    (
        "defaults:\n  tolerances: {goodput: -1%}\nbenchmarks:\n  - name: a\n",
        "2",
        "defaults.tolerances.goodput",
        "goodput needs an slo",
    ),
    (
        "benchmarks:\n  - name: a\n    config: {max_num_seqs: 0}\n    tolerances: {failed: 0}\n",
        "3",
        "benchmarks[0].config",
        "EngineConfig.max_num_seqs: must be at least 1",
    ),
    ("benchmark:\n  - name: a\n", "1", "benchmark", "not a known key"),
    ("benchmarks: [{name: a, tolerances: {x: 1}\n", "2", "", "not valid YAML"),
]


@pytest.mark.parametrize(("text", "line", "key", "problem"), MALFORMED)
def test_a_malformed_suite_exits_2_naming_file_key_and_problem(
    tmp_path: Path, text: str, line: str, key: str, problem: str
) -> None:
    suite = write(tmp_path, "bad.yaml", text)
    code, output = invoke("run", suite, "--out", tmp_path / "out")
    assert code == 2, output
    flat = " ".join(output.split())
    assert f"{suite}:{line}: {key}".rstrip() in flat
    assert problem in flat
    assert not (tmp_path / "out").exists()


def test_input_errors_at_run_time_and_in_files_exit_2(tmp_path: Path, tiny_trace: Path) -> None:
    suite = write(tmp_path, "s.yaml", sim_suite(tmp_path / "no-such-trace.jsonl"))
    code, output = invoke("run", suite, "--out", tmp_path / "out")
    assert code == 2
    assert "chat: trace" in output and "no-such-trace.jsonl" in output
    code, output = invoke("compare", "--baseline", tmp_path / "x.json", "--current", tmp_path)
    assert code == 2
    assert "--baseline" in output and "x.json" in output
    code, output = invoke("regress-typo.yaml", "--baseline", tmp_path / "x.json")
    assert code == 2 and "--baseline" in output
    code, output = invoke("run", suite, "--out", tmp_path / "r.json")
    assert code == 2 and "--out" in output and "should be a folder" in output


def test_the_cli_stays_lazy() -> None:
    import subprocess
    import sys

    code = (
        "import sys, slotune.cli.app; "
        "print(sorted(m for m in ('slotune.regress', 'yaml', 'pandas') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
