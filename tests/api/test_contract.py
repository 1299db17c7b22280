"""The proto contract: generated code is current, and `buf lint` is clean."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.ci import unavailable
from tests.pins import makefile_pin

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_matches_the_proto_files(tmp_path: Path) -> None:
    out = tmp_path / "genproto"
    subprocess.run(
        [sys.executable, str(ROOT / "proto" / "generate.py"), "--out", str(out)], check=True
    )
    committed = ROOT / "genproto"
    fresh = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    current = {
        p.relative_to(committed): p.read_bytes()
        for p in committed.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    stale = sorted(
        str(path) for path in fresh.keys() | current.keys() if fresh.get(path) != current.get(path)
    )
    assert not stale, f"genproto/ is stale; run `make proto`: {stale}"


def test_buf_lint_is_clean() -> None:
    version = makefile_pin("BUF_VERSION")
    # Where `make buf` installs the pinned version (the path names it, so a new pin
    # installs anew), else one on PATH of the same version.
    pinned = ROOT / ".cache" / f"buf-{version}" / "node_modules" / ".bin" / "buf"
    buf = str(pinned) if pinned.exists() else shutil.which("buf")
    if buf is None:
        unavailable(f"buf {version} is not installed (`make buf` installs it from npm)")
    printed = subprocess.run([buf, "--version"], capture_output=True, text=True).stdout.strip()
    assert printed == version, f"{buf} says {printed!r}, the Makefile pins {version}"
    result = subprocess.run([buf, "lint"], cwd=ROOT / "proto", capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
