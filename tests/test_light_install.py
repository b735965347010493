"""Without the ``engine`` extra (no torch, no triton): the simulator works, the real engine
says which extra to install."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

NO_TORCH = """
import sys
sys.modules["torch"] = None  # `import torch` now raises ImportError, as when not installed
sys.modules["triton"] = None
"""


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", NO_TORCH + textwrap.dedent(code)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_simulator_runs_without_torch(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    done = _run(
        f"""
        from slotune.cli.app import main
        sys.argv = ["slotune", "bench", "--gpu", "h100", "--trace", "agent", "--rate", "4",
                    "--num-requests", "20", "--slo", "ttft=300ms,tpot=50ms", "--out", {str(out)!r}]
        try:
            main()
        except SystemExit as e:
            assert not e.code, e.code
        assert "torch" not in sys.modules or sys.modules["torch"] is None
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_requests"] == 20


def test_the_real_engine_names_the_extra_without_torch(tmp_path: Path) -> None:
    done = _run(
        """
        from slotune._extras import MissingExtra
        from slotune.engine import Engine, EngineConfig
        try:
            Engine.local(EngineConfig(), model="some-dir")
        except MissingExtra as e:
            print(e)
        else:
            raise SystemExit("no error")
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "needs torch" in done.stdout and "pip install 'slotune[engine]'" in done.stdout


def test_an_engine_command_without_torch_is_one_error_line(tmp_path: Path) -> None:
    done = _run(
        f"""
        from slotune.cli.app import main
        sys.argv = ["slotune", "init-model", {str(tmp_path / "m")!r}, "--preset", "tiny"]
        main()
        """,
        tmp_path,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "slotune[engine]" in lines[0], done.stderr
