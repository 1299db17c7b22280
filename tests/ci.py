"""What a test does when something it needs is missing (Cassandra, buf, kustomize, Go,
promtool): on a workstation it skips with the hint that provides it; in CI it fails, since
CI must never pass by skipping.

CI is detected one way everywhere: the CI variable (`.ci/run` exports CI=true, as CI
services do), compared case-insensitively, so CI=True or CI=TRUE count too.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NoReturn

import pytest


def in_ci(env: Mapping[str, str] | None = None) -> bool:
    """Whether the tests run in CI (`CI=true`, in any case)."""
    return (os.environ if env is None else env).get("CI", "").lower() == "true"


def unavailable(reason: str) -> NoReturn:
    """Stop the current test (or fixture) for want of `reason`: a failure in CI, a skip
    elsewhere."""
    if in_ci():
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)
