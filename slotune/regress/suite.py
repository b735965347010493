"""Loading a suite file: YAML, checked against the schema and then against the rules a
schema cannot state (per-backend keys, metric names, SLOs, engine configurations), with
every problem named by file, line and key."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

import yaml

from slotune.regress.metrics import check_metric
from slotune.regress.schema import validate
from slotune.regress.tolerance import Tolerance, parse_tolerance

KeyPath = tuple[str | int, ...]
_REAL_REPEATS = 3
_BACKEND_KEYS = {
    "sim": {"gpu", "model", "tp", "ep", "quantization", "stack", "timeout_s"},
    "engine": {"model", "timeout_s"},
    "http": {"url", "model", "endpoint", "server", "server_timeout_s", "timeout_s"},
    "command": {"command", "metrics_file"},
}
_RUN_KEYS = {"trace", "num_requests", "load", "config", "slo", "seed"}


class SuiteError(ValueError):
    """A suite that cannot be used; ``problems`` are (location, problem) lines."""

    def __init__(self, problems: Sequence[tuple[str, str]]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(f"{where}: {what}" for where, what in self.problems))


@dataclass(frozen=True)
class TraceSpec:
    name: str
    format: str | None = None
    num_requests: int | None = None
    tokenizer: str | None = None
    multi_turn: bool = False


@dataclass(frozen=True)
class Benchmark:
    """One benchmark of a suite, defaults applied and paths resolved."""

    name: str
    backend: str
    tolerances: dict[str, Tolerance]
    repeats: int
    report_only: frozenset[str] = frozenset()
    warmup: int = 0
    gpu: str = "h100"
    model: str = "llama-3-8b"
    tp: int = 1
    ep: int = 1
    quantization: str | None = None
    stack: str | None = None
    timeout_s: float | None = None
    url: str | None = None
    endpoint: str = "completions"
    server: str | None = None
    server_timeout_s: float = 120.0
    command: str | list[str] | None = None
    metrics_file: str | None = None
    trace: TraceSpec = TraceSpec("sharegpt-like")
    load: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    slo: str | None = None
    seed: int = 0
    workdir: Path = Path(".")

    @property
    def deterministic(self) -> bool:
        return self.backend == "sim"


@dataclass(frozen=True)
class Suite:
    path: Path
    benchmarks: list[Benchmark]


def load_suite(path: str | Path) -> Suite:
    """Read and check a suite file; ``SuiteError`` lists every problem found."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SuiteError([(str(path), f"cannot read: {exc.strerror or exc}")]) from None
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise SuiteError([(where, f"not valid YAML: {getattr(exc, 'problem', exc)}")]) from None
    locate = _Locator(path, node)
    if data is None:
        raise SuiteError([(str(path), "the file is empty; it needs a list of benchmarks")])
    problems = [(locate(p), what) for p, what in validate(data)]
    if isinstance(data, dict) and "name" in (data.get("defaults") or {}):
        problems.append((locate(("defaults", "name")), "a name belongs to each benchmark"))
    if problems:
        raise SuiteError(problems)
    benchmarks = [_benchmark(data, i, path.parent, locate) for i in range(len(data["benchmarks"]))]
    problems = [p for b in benchmarks if isinstance(b, SuiteError) for p in b.problems]
    names = [b["name"] for b in data["benchmarks"]]
    for i, name in enumerate(names):
        if name in names[:i]:
            problems.append((locate(("benchmarks", i, "name")), f"{name!r} is used twice"))
    if problems:
        raise SuiteError(problems)
    return Suite(path, [b for b in benchmarks if isinstance(b, Benchmark)])


def _benchmark(data: dict, index: int, base: Path, locate: _Locator) -> Benchmark | SuiteError:
    """The benchmark at ``index`` with the suite's defaults, or the problems it has."""
    own = data["benchmarks"][index]
    defaults = data.get("defaults", {})
    merged = {"tolerances": {}, **defaults, **own}

    def where(*key: str | int) -> str:
        origin = ("benchmarks", index) if key[0] in own or key[0] == "name" else ("defaults",)
        return locate((*origin, *key))

    problems: list[tuple[str, str]] = []
    backend = merged.get("backend", "sim")
    _check_backend_keys(merged, own, backend, where, problems)
    tolerances = _tolerances(merged, backend, where, problems)
    config = _config(merged.get("config"), base, where, problems)
    if merged.get("slo") is not None:
        from slotune.workloads.slo import parse_slo

        try:
            parse_slo(merged["slo"])
        except ValueError as exc:
            problems.append((where("slo"), str(exc)))
    if problems:
        return SuiteError(problems)
    return _build(merged, backend, tolerances, config, base)


def _check_backend_keys(merged: dict, own: dict, backend: str, where: Any, problems: list) -> None:
    """Required keys of the backend; keys of another backend set on this benchmark itself
    (inherited defaults may serve other benchmarks)."""
    required = {"engine": ("model",), "http": ("url", "model"), "command": ("command",)}
    for key in required.get(backend, ()):
        if key not in merged:
            problems.append((where("name"), f"backend {backend} needs {key!r}"))
    run_keys = {"command": set(), "http": _RUN_KEYS - {"config"}}.get(backend, _RUN_KEYS)
    allowed = _BACKEND_KEYS[backend] | run_keys
    for key in own:
        owner = next((b for b, keys in _BACKEND_KEYS.items() if key in keys), None)
        if (owner or key in _RUN_KEYS) and key not in allowed:
            problems.append((where(key), f"is not used by backend {backend}"))


def _tolerances(merged: dict, backend: str, where: Any, problems: list) -> dict[str, Tolerance]:
    if not merged["tolerances"]:
        problems.append((where("name"), "needs tolerances: the metrics to judge"))
    out = {}
    has_slo = merged.get("slo") is not None
    for metric, text in merged["tolerances"].items():
        why = check_metric(metric, backend=backend, has_slo=has_slo)
        try:
            out[metric] = parse_tolerance(text)
        except ValueError as exc:
            why = why or str(exc)
        if why:
            problems.append((where("tolerances", metric), why))
    report_only = merged.get("report_only")
    for metric in report_only if isinstance(report_only, list) else ():
        if metric not in merged["tolerances"]:
            problems.append((where("report_only"), f"{metric!r} is not among the tolerances"))
    return out


def _config(value: Any, base: Path, where: Any, problems: list) -> dict[str, Any]:
    """EngineConfig fields from the suite or a JSON file, checked as far as they can be
    before the trace is known (``max_model_len`` defaults to its longest request)."""
    if value is None:
        return {}
    if isinstance(value, str):
        file = base / value
        try:
            value = json.loads(file.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            problems.append((where("config"), f"cannot read {file}: {exc}"))
            return {}
        if isinstance(value, dict) and isinstance(value.get("config"), dict):
            value = value["config"]  # best.json or summary.json
        if not isinstance(value, dict):
            problems.append(
                (where("config"), f"{file} is not a JSON object of EngineConfig fields")
            )
            return {}
    from slotune.engine.config import EngineConfig

    try:
        EngineConfig.from_dict({"max_model_len": 1, **value})
    except (ValueError, TypeError) as exc:
        problems.append((where("config"), str(exc)))
    return dict(value)


def _build(
    merged: dict, backend: str, tolerances: dict[str, Tolerance], config: dict, base: Path
) -> Benchmark:
    trace = merged.get("trace", "sharegpt-like")
    spec = TraceSpec(**trace) if isinstance(trace, dict) else TraceSpec(trace)
    spec = TraceSpec(
        _path_or_name(spec.name, base),
        spec.format,
        merged.get("num_requests"),
        _path_or_name(spec.tokenizer, base),
        spec.multi_turn,
    )
    keys = _BACKEND_KEYS[backend] | {"seed", "slo", "load", "warmup"}
    options = {k: merged[k] for k in keys if k in merged}
    report_only = merged.get("report_only", False)
    options["report_only"] = frozenset(tolerances if report_only is True else report_only or ())
    if backend == "engine":
        options["model"] = str(base / merged["model"])
    if backend == "sim":
        options["gpu"] = _path_or_name(merged.get("gpu", "h100"), base)
        if "stack" in merged:
            options["stack"] = _path_or_name(merged["stack"], base)
    return Benchmark(
        name=merged["name"],
        backend=backend,
        tolerances=tolerances,
        repeats=merged.get("repeats", 1 if backend == "sim" else _REAL_REPEATS),
        trace=spec,
        config=config,
        workdir=base,
        **options,
    )


@overload
def _path_or_name(value: str, base: Path) -> str: ...
@overload
def _path_or_name(value: None, base: Path) -> None: ...
def _path_or_name(value: str | None, base: Path) -> str | None:
    """A file relative to the suite, when it exists there; else the value as given (a
    bundled trace name, or a path the loader will report)."""
    if value is None or Path(value).is_absolute():
        return value
    candidate = base / value
    return str(candidate) if candidate.exists() else value


class _Locator:
    """``file:line: key.path`` for a key path, from the YAML node tree."""

    def __init__(self, path: Path, root: yaml.Node | None) -> None:
        self.path = path
        self.root = root

    def __call__(self, key: KeyPath) -> str:
        line = self._line(key)
        where = f"{self.path}:{line}" if line else str(self.path)
        return f"{where}: {_format_key(key)}" if key else where

    def _line(self, key: KeyPath) -> int | None:
        node, line = self.root, None
        for part in key:
            if isinstance(node, yaml.MappingNode):
                match = [(k, v) for k, v in node.value if k.value == part]
                if not match:
                    break
                node = match[0][1]
                line = match[0][0].start_mark.line + 1
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
                node = node.value[part]
                line = node.start_mark.line + 1
            else:
                break
        return line


def _format_key(key: KeyPath) -> str:
    out = ""
    for part in key:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
