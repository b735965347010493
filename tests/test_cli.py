import subprocess
import sys

from typer.testing import CliRunner

from slotune import __version__
from slotune.cli.app import app


def test_version_flag_prints_package_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"slotune {__version__}"


def test_help_lists_commands() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "SLO" in result.stdout


def test_cli_start_does_not_import_torch() -> None:
    code = "import sys, slotune.cli.app; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
