"""Shared test configuration: hypothesis profiles and the `slow` marker."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=100, deadline=None)
settings.register_profile(
    "ci", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip `slow` tests unless AGENTTX_SLOW=1 asks for the long campaigns."""
    if os.environ.get("AGENTTX_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="long campaign: set AGENTTX_SLOW=1 to run it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
