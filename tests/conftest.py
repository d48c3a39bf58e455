"""Suite-wide hooks. `@pytest.mark.needs_components(...)`: see tests/suite_components.py."""

from __future__ import annotations

import pytest

from suite_components import require_components


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("needs_components"):
        require_components(*mark.args)
