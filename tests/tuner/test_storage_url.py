"""Storage URLs reach SQLAlchemy with a PostgreSQL driver that is installed, and the
environment the extras build has the driver SQLAlchemy picks for a bare ``postgresql://``."""

from __future__ import annotations

import importlib.util

import pytest

from slotune.tuner import storage
from slotune.tuner.storage import StudyError, with_driver

URL = "postgresql://slotune:secret@db-host:5432/slotune"


def _installed(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        if name in ("psycopg", "psycopg2"):
            return object() if name in modules else None
        return real(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_psycopg_3_is_named_when_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    _installed(monkeypatch, "psycopg", "psycopg2")
    assert with_driver(URL) == "postgresql+psycopg://slotune:secret@db-host:5432/slotune"
    assert with_driver("postgres://u@h/d") == "postgresql+psycopg://u@h/d"


def test_psycopg2_alone_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    _installed(monkeypatch, "psycopg2")
    assert with_driver(URL) == "postgresql+psycopg2://slotune:secret@db-host:5432/slotune"


def test_no_driver_names_the_extra_and_hides_the_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _installed(monkeypatch)
    with pytest.raises(StudyError) as e:
        storage.open_storage.__wrapped__(URL)
    assert "pip install 'slotune[postgres]'" in str(e.value)
    assert "secret" not in str(e.value)


def test_other_urls_are_left_alone() -> None:
    for url in ("postgresql+psycopg2://u@h/d", "sqlite:///x.db", "journal:/tmp/x.log"):
        assert with_driver(url) == url


def test_the_driver_sqlalchemy_picks_for_a_bare_url_is_installed() -> None:
    """What a fresh ``pip install 'slotune[dev]'`` must give: SQLAlchemy 2.1 maps a bare
    ``postgresql://`` to psycopg 3, and other tools given the same URL (optuna-dashboard,
    Optuna's CLI) do not rewrite it as slotune does."""
    from sqlalchemy.engine import make_url

    driver = make_url(URL).get_dialect().driver
    assert importlib.util.find_spec(driver) is not None, (
        f"SQLAlchemy uses {driver} for postgresql:// but it is not installed: the "
        "postgres/dev extras must bring it"
    )
