"""Printing admin results: an aligned table for people, `--json` for scripts."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any


def iso(instant: datetime | None) -> str | None:
    """RFC 3339 UTC with milliseconds, or None."""
    if instant is None:
        return None
    return instant.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def print_json(document: Mapping[str, Any]) -> None:
    print(json.dumps(document, indent=2, sort_keys=True, default=str))


def print_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> None:
    """One line per row, columns aligned; a missing value prints as '-'."""
    cells = [[_cell(row.get(column)) for column in columns] for row in rows]
    widths = [
        max([len(column), *(len(line[i]) for line in cells)]) for i, column in enumerate(columns)
    ]
    for line in ([*columns], *cells):
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        )


def print_counts(title: str, counts: Mapping[str, int]) -> None:
    print(title)
    for name, value in sorted(counts.items()):
        print(f"  {name:<24} {value}")


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)
