"""Opaque, validated page tokens and page sizes (AIP-158), for every listing the
services answer: the API's reminders and deliveries, the notifier's recorded pushes."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from reminders_svc.domain.errors import InvalidArgument

Cursor = TypeVar("Cursor")


@dataclass(frozen=True)
class Pages(Generic[Cursor]):
    """The opaque page tokens of one listing; `kind` names the listing and its filter.

    A token is accepted only if it is exactly one this server writes for this listing, so
    whatever a client sends, the cursor reaching storage is one `parse` made from `render`.
    """

    kind: str
    parse: Callable[[str], Cursor]
    render: Callable[[Cursor], str]

    def token(self, cursor: Cursor | None) -> str:
        if cursor is None:
            return ""
        raw = json.dumps({"v": 1, "k": self.kind, "c": self.render(cursor)}).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    def cursor(self, token: str) -> Cursor | None:
        if not token:
            return None
        refused = InvalidArgument("page_token", "not a token from this listing")
        try:
            text = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))["c"]
            if not isinstance(text, str):
                raise refused
            cursor = self.parse(text)
        except (ValueError, KeyError, TypeError, RecursionError):
            raise refused from None
        if self.token(cursor) != token:
            raise refused
        return cursor


def owner_tag(user_id: str) -> str:
    """A listing's owner as its `kind` names it, so that a token from another caller's
    listing is refused (not the id itself: tokens end up in logs and URLs)."""
    return hashlib.sha256(user_id.encode()).hexdigest()[:16]


def page_size(requested: int, default: int, largest: int) -> int:
    if requested < 0:
        raise InvalidArgument("page_size", "must not be negative")
    return min(requested or default, largest)
