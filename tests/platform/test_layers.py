"""The architecture one can see in the tree (README, docs/architecture.md): data flows
api -> use cases -> domain, storage below; nothing imports the layer above it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Modules (by path prefix) and the imports (by module prefix) they must not make.
_FRAMEWORKS = ("grpc", "genproto", "cassandra", "prometheus_client")
_RULES: list[tuple[str, tuple[str, ...]]] = [
    # Pure: no I/O, no framework, nothing above them.
    (
        "reminders_svc/domain/",
        (*_FRAMEWORKS, "reminders_svc.storage", "reminders_svc.api", "reminders_svc.app"),
    ),
    (
        "reminders_svc/schedule/",
        (*_FRAMEWORKS, "reminders_svc.storage", "reminders_svc.api", "reminders_svc.domain"),
    ),
    # The use cases take and return domain values: no gRPC, no proto, no API settings.
    ("reminders_svc/app.py", ("grpc", "genproto", "reminders_svc.api")),
    ("reminders_svc/deliveries.py", ("grpc", "genproto", "reminders_svc.api")),
    ("reminders_svc/erasure.py", ("grpc", "genproto", "reminders_svc.api")),
    # Storage serves the use cases and the dispatcher, and knows neither.
    (
        "reminders_svc/storage/",
        ("grpc", "genproto", "reminders_svc.api", "reminders_svc.app", "dispatcher", "notifier"),
    ),
    # The API's adapter is the API's: no other deployable's code.
    ("reminders_svc/api/", ("dispatcher", "notifier", "devnode")),
]


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
    return found


def _breaks(paths: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    assert paths
    assert all(path.exists() for path in paths)
    return [
        f"{path.name} imports {name}"
        for path in paths
        for name in _imports(path)
        if any(name == banned or name.startswith(banned + ".") for banned in forbidden)
    ]


@pytest.mark.parametrize(("prefix", "forbidden"), _RULES, ids=[rule[0] for rule in _RULES])
def test_no_module_imports_a_layer_it_must_not(prefix: str, forbidden: tuple[str, ...]) -> None:
    paths = [ROOT / prefix] if prefix.endswith(".py") else sorted((ROOT / prefix).rglob("*.py"))
    assert _breaks(paths, forbidden) == []


def test_the_rules_catch_an_import_that_breaks_them(tmp_path: Path) -> None:
    # The use cases imported the API's settings until 2026-12-07.
    app = tmp_path / "app.py"
    app.write_text("import asyncio\nfrom reminders_svc.api.settings import Limits\n")
    assert _breaks([app], ("reminders_svc.api",)) == ["app.py imports reminders_svc.api.settings"]
