"""The tool versions the Makefile pins: one source of truth for the tests that use them."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def makefile_pin(name: str) -> str:
    """The value of `name := ...` in the Makefile (e.g. KUSTOMIZE_VERSION)."""
    match = re.search(rf"^{name}\s*:=\s*(\S+)", (REPO / "Makefile").read_text(), re.M)
    assert match, f"Makefile: {name} := <version>"
    return match.group(1)
