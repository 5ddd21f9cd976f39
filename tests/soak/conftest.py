"""The soak marker: ``pytest -m soak`` selects the differential soak, ``-m 'not soak'`` leaves it out."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "soak: the differential soak (real processes, kill -9, ~3 min)")
