"""Fixtures of the params tests."""

import sys

import pytest

from tests.params.fake_experiments import CANARY


@pytest.fixture
def canary(tmp_path, monkeypatch):
    """A module ``CANARY`` on sys.path whose import creates a file: the test must never import it."""
    marker = tmp_path / "imported"
    (tmp_path / f"{CANARY}.py").write_text(f"open({str(marker)!r}, 'w').close()\nclass Thing: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield marker
    assert not marker.exists() and CANARY not in sys.modules
