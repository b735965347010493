"""The suite format: the JSON Schema file, the loader that enforces it, and the shipped
suites (the project's own and the CI examples) that must load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slotune.regress import SuiteError, load_suite
from slotune.regress.schema import SUPPORTED, suite_schema, validate
from slotune.regress.suite import _BACKEND_KEYS, _RUN_KEYS
from tests.regress.conftest import sim_suite, write

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_FILE = ROOT / "slotune" / "regress" / "suite.schema.json"
SHIPPED = [ROOT / "benchmarks" / "suite.yaml", *sorted((ROOT / "examples" / "ci").glob("*.yaml"))]
SHIPPED = [p for p in SHIPPED if not p.name.startswith(".") and "suite" in p.name]


def keywords(node: object) -> set[str]:
    if isinstance(node, dict):
        found = set(node) - {"properties", "$defs"}
        for key, value in node.items():
            if key in ("properties", "$defs"):
                for sub in value.values():
                    found |= keywords(sub)
            elif isinstance(value, (dict, list)):
                found |= keywords(value)
        return found
    if isinstance(node, list):
        return set().union(*(keywords(v) for v in node)) if node else set()
    return set()


def test_the_schema_is_json_that_uses_only_what_the_loader_enforces() -> None:
    schema = json.loads(SCHEMA_FILE.read_text())
    assert schema == suite_schema()
    assert schema["$schema"].startswith("https://json-schema.org/")
    assert keywords(schema) <= SUPPORTED
    settings = schema["$defs"]["settings"]["properties"]
    loader_keys = set().union(*_BACKEND_KEYS.values()) | _RUN_KEYS
    loader_keys |= {"name", "backend", "repeats", "warmup", "report_only", "tolerances"}
    assert set(settings) == loader_keys


def test_the_schema_and_the_loader_agree_on_examples(tmp_path: Path, tiny_trace: Path) -> None:
    good = json.loads(json.dumps(__import__("yaml").safe_load(sim_suite(tiny_trace))))
    assert validate(good) == []
    suite = load_suite(write(tmp_path, "good.yaml", sim_suite(tiny_trace)))
    assert [b.name for b in suite.benchmarks] == ["chat", "burst"]
    bad = {"benchmarks": [{"name": "a b", "repeats": 0, "tolerances": {"wall_s": "5%"}}]}
    problems = dict(validate(bad))
    assert set(problems) == {
        ("benchmarks", 0, "name"),
        ("benchmarks", 0, "repeats"),
        ("benchmarks", 0, "tolerances", "wall_s"),
    }
    with pytest.raises(SuiteError) as info:
        load_suite(write(tmp_path, "bad.yaml", json.dumps(bad)))
    assert len(info.value.problems) == 3


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_suites_load(path: Path) -> None:
    suite = load_suite(path)
    assert suite.benchmarks
    assert all(b.tolerances for b in suite.benchmarks)


def test_defaults_merge_and_paths_resolve_against_the_suite(tmp_path: Path) -> None:
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "best.json").write_text(json.dumps({"config": {"max_num_seqs": 7}}))
    text = """\
defaults:
  slo: ttft=1s
  tolerances: {goodput: -1%, ttft_ms.p99: +5%}
benchmarks:
  - name: a
    config: cfg/best.json
    tolerances: {ttft_ms.p99: +1%}
  - name: b
    backend: command
    command: ["{python}", "-c", "print(1)"]
    tolerances: {rows.0.total_ms: +50%}
    report_only: true
"""
    suite = load_suite(write(tmp_path, "s.yaml", text))
    a, b = suite.benchmarks
    assert {m: str(t) for m, t in a.tolerances.items()} == {"ttft_ms.p99": "+1%"}  # replaced
    assert {m: str(t) for m, t in b.tolerances.items()} == {"rows.0.total_ms": "+50%"}
    assert a.config == {"max_num_seqs": 7}
    assert (a.backend, a.repeats, a.report_only, a.deterministic) == ("sim", 1, set(), True)
    assert (b.backend, b.repeats, b.deterministic) == ("command", 3, False)
    assert b.report_only == {"rows.0.total_ms"}  # true: all of its metrics
    assert b.workdir == tmp_path


def test_every_problem_is_reported_with_its_line(tmp_path: Path) -> None:
    text = """\
benchmarks:
  - name: a
    backend: http
    gpu: h100
    tolerances: {wall_s: +5%}
  - name: a
    tolerances: {ttft_ms.p999: +5%}
"""
    path = write(tmp_path, "s.yaml", text)
    with pytest.raises(SuiteError) as info:
        load_suite(path)
    assert [p[0] for p in info.value.problems] == [
        f"{path}:2: benchmarks[0].name",
        f"{path}:2: benchmarks[0].name",
        f"{path}:4: benchmarks[0].gpu",
        f"{path}:7: benchmarks[1].tolerances.ttft_ms.p999",
        f"{path}:6: benchmarks[1].name",
    ]
    assert [p[1] for p in info.value.problems] == [
        "backend http needs 'url'",
        "backend http needs 'model'",
        "is not used by backend http",
        "ttft_ms takes .mean or .pNN with NN at most 100 (e.g. ttft_ms.p99), not 'p999'",
        "'a' is used twice",
    ]


def test_unreadable_and_empty_files_are_suite_errors(tmp_path: Path) -> None:
    with pytest.raises(SuiteError, match="cannot read"):
        load_suite(tmp_path / "missing.yaml")
    with pytest.raises(SuiteError, match="empty"):
        load_suite(write(tmp_path, "empty.yaml", ""))
    with pytest.raises(SuiteError, match=r"benchmarks: must be a list, not a mapping"):
        load_suite(write(tmp_path, "m.yaml", "benchmarks: {a: 1}\n"))
