from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.reports.synthetic import write_out_dir


@pytest.fixture(scope="session")
def tune_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tune")
    write_out_dir(out, n_trials=40, objective="goodput", n_requests=200)
    return out


@pytest.fixture(scope="session")
def best(tune_dir: Path) -> dict[str, Any]:
    import json

    return json.loads((tune_dir / "best.json").read_text())


@pytest.fixture(scope="session")
def pareto_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pareto")
    write_out_dir(out, n_trials=30, objective="pareto", n_requests=100)
    return out


@pytest.fixture(scope="session")
def tune_report(tune_dir: Path) -> Path:
    from slotune.reports import build_report

    return build_report(tune_dir)
