"""The CLI is thin: a command builds typed options explicitly from its parameters and calls
one package function. No parameter reaches the package through ``locals()``, and every
parameter of ``bench`` and ``serve`` lands in the option field of its name."""

from __future__ import annotations

import ast
import inspect
import json
import typing
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from slotune.cli.app import app
from slotune.cli.bench import bench
from slotune.cli.serve import serve
from slotune.engine.config import EngineConfig
from slotune.engine.knobs import EngineKnobs

CLI = Path(__file__).resolve().parents[1] / "slotune" / "cli"
runner = CliRunner()


def _calls_locals(tree: ast.AST) -> list[int]:
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and (node.func.id == "locals" or (node.func.id == "vars" and not node.args))
    ]


def test_no_cli_module_passes_locals() -> None:
    found = {
        path.name: lines
        for path in sorted(CLI.glob("*.py"))
        if (lines := _calls_locals(ast.parse(path.read_text())))
    }
    assert found == {}, f"locals()/vars() in slotune/cli (file: lines): {found}"


def test_the_locals_check_finds_a_call() -> None:
    assert _calls_locals(ast.parse("def f(a):\n    g(**locals())\n")) == [2]
    assert _calls_locals(ast.parse("x = vars()\ny = vars(o)\n")) == [1]


def test_every_knob_is_an_engine_config_field() -> None:
    config_fields = {f.name for f in fields(EngineConfig)}
    assert {f.name for f in fields(EngineKnobs)} <= config_fields


@pytest.mark.parametrize("command", [bench, serve])
def test_a_command_has_a_flag_for_every_knob_and_no_other_engine_field(command: Any) -> None:
    knobs = {f.name for f in fields(EngineKnobs)}
    config_fields = {f.name for f in fields(EngineConfig)}
    params = set(inspect.signature(command).parameters)
    assert knobs <= params, f"knobs without a {command.__name__} flag: {knobs - params}"
    strays = (params & config_fields) - knobs
    assert not strays, f"engine flags outside EngineKnobs: {strays}"


def _options(command: Any) -> list[tuple[str, str, Any]]:
    """``(parameter, flag, typer type)`` of each option of ``command``."""
    hints = typing.get_type_hints(command, include_extras=True)
    out = []
    for name in inspect.signature(command).parameters:
        hint = hints[name]
        base, info = typing.get_args(hint)[0], typing.get_args(hint)[1]
        kinds = [t for t in typing.get_args(base) if t is not type(None)] or [base]
        # typer.Option("--flag", ...) keeps the first flag as its "default"
        decls = [info.default, *info.param_decls]
        flag = next(d for d in decls if isinstance(d, str) and d.startswith("--"))
        out.append((name, flag, kinds[0]))
    return out


def _distinct_args(command: Any, skip: tuple[str, ...] = ()) -> tuple[list[str], dict[str, Any]]:
    """Every option of ``command`` but ``skip`` set to a value of its type that no other
    option has (and no default is): the arguments, and the value each should arrive as."""
    args: list[str] = []
    expected: dict[str, Any] = {}
    for i, (name, flag, kind) in enumerate(_options(command)):
        if name in skip:
            continue
        if kind is bool:
            args.append(flag)
            expected[name] = True
            continue
        value: Any = {int: 1000 + i, float: 0.5 + i, str: f"s{i}", Path: Path(f"/tmp/p{i}")}[kind]
        args += [flag, str(value)]
        expected[name] = value
    return args, expected


def _flat(obj: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        if is_dataclass(value):
            out.update(_flat(value, f"{prefix}{f.name}."))
        else:
            out[prefix + f.name] = value
    return out


def _field_of(name: str, flat: dict[str, Any], renamed: dict[str, str]) -> str:
    if name in renamed:
        return renamed[name]
    (path,) = [p for p in flat if p.rpartition(".")[2] == name]
    return path


BENCH_RENAMED = {"trace": "trace.name", "target_name": "target"}
SERVE_RENAMED = {"target_name": "target"}


def test_every_bench_parameter_lands_in_its_option_field(monkeypatch: pytest.MonkeyPatch) -> None:
    import slotune.api
    from slotune.workloads.bench import BenchError

    seen = []

    def capture(request: Any, view: Any = None) -> Any:
        seen.append(request)
        raise BenchError("captured")

    monkeypatch.setattr(slotune.api, "bench", capture)
    args, expected = _distinct_args(bench)
    res = runner.invoke(app, ["bench", *args])
    assert "captured" in res.output, res.output
    flat = _flat(seen[0])
    for name, value in expected.items():
        if name == "as_json":  # how the CLI prints, not an option of the run
            continue
        assert flat[_field_of(name, flat, BENCH_RENAMED)] == value, name
    assert seen[0].knobs == EngineKnobs(**{k: expected[k] for k in _names(EngineKnobs)})


def test_every_serve_parameter_lands_in_its_option_field(monkeypatch: pytest.MonkeyPatch) -> None:
    import slotune.server.launch as launch
    from slotune.server.launch import ServeError

    seen = []

    def capture(request: Any, on_ready: Any = None) -> None:
        seen.append(request)
        raise ServeError("captured")

    monkeypatch.setattr(launch, "launch", capture)
    args, expected = _distinct_args(serve)
    res = runner.invoke(app, ["serve", *args])
    assert "captured" in res.output, res.output
    flat = _flat(seen[0])
    for name, value in expected.items():
        assert flat[_field_of(name, flat, SERVE_RENAMED)] == value, name
    assert seen[0].knobs == EngineKnobs(**{k: expected[k] for k in _names(EngineKnobs)})


def _names(cls: Any) -> list[str]:
    return [f.name for f in fields(cls)]


def test_serve_help_states_the_default_max_model_len() -> None:
    from slotune.server.launch import DEFAULT_MAX_MODEL_LEN

    res = runner.invoke(app, ["serve", "--help"], env={"COLUMNS": "200"})
    assert f"at most {DEFAULT_MAX_MODEL_LEN}" in res.output


def _summary(args: list[str]) -> dict[str, Any]:
    res = runner.invoke(app, ["bench", "--num-requests", "20", "--rate", "20", "--json", *args])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    summary.pop("date")
    return summary


def test_bench_target_simulates_the_target_stack() -> None:
    """``--target slotune`` is ``--stack eager``, not the default stack."""
    by_target = _summary(["--target", "slotune"])
    assert by_target["stack"] == "eager"
    assert by_target == _summary(["--stack", "eager"])
    assert by_target["e2el_ms"] != _summary([])["e2el_ms"]


def test_every_tune_parameter_lands_in_its_option_field(monkeypatch: pytest.MonkeyPatch) -> None:
    import slotune.api
    from slotune.cli.tune import tune
    from slotune.tuner.workflow import StudyError, TuneOptions

    seen = []

    def capture(options: Any, **kwargs: Any) -> Any:
        seen.append(options)
        raise StudyError("captured")

    monkeypatch.setattr(slotune.api, "tune", capture)
    # --gpus runs the deployment search instead (tests/test_cluster_deploy.py).
    args, expected = _distinct_args(tune, skip=("gpus",))
    res = runner.invoke(app, ["tune", *args])
    assert "captured" in res.output, res.output
    assert set(expected) == set(_names(TuneOptions))
    assert seen[0] == TuneOptions(**expected)


def test_the_python_api_gives_the_cli_summary(tmp_path: Path) -> None:
    """The CLI adds nothing to a bench but printing: the API's summary and folder are its."""
    from slotune.api import bench as api_bench
    from slotune.workloads.bench import BenchRequest, LoadOptions, TraceOptions

    args = ["--trace", "agent", "--slo", "ttft=300ms", "--max-num-seqs", "8"]
    cli = _summary([*args, "--out", str(tmp_path / "cli")])
    request = BenchRequest(
        trace=TraceOptions(name="agent", num_requests=20),
        load=LoadOptions(rate=20),
        slo="ttft=300ms",
        knobs=EngineKnobs(max_num_seqs=8),
        out=tmp_path / "api",
    )
    outcome = api_bench(request)
    outcome.summary.pop("date")
    assert json.loads(json.dumps(outcome.summary, default=str)) == cli
    assert outcome.report == tmp_path / "api" / "report.html" and outcome.report.is_file()
    on_disk = json.loads((tmp_path / "api" / "summary.json").read_text())
    assert on_disk["e2el_ms"] == cli["e2el_ms"]
