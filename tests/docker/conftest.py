"""Fixtures shared by the docker/ checks: the normalized compose model."""

from __future__ import annotations

from typing import Any

import pytest

from tests.docker.helpers import compose_model


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return compose_model("gpu")
