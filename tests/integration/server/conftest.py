"""The sidebar's endpoints against a real Jupyter server (pytest-jupyter's ``jp_fetch``, loaded
by tests/conftest.py) with nbdist's server extension enabled, each test with its own data folder."""

from __future__ import annotations

import pytest


@pytest.fixture
def jp_server_config(data_dir):
    # allow_unauthenticated_access stays at its default (True): only our decorators protect us.
    return {"ServerApp": {"jpserver_extensions": {"nbdist": True}}}
