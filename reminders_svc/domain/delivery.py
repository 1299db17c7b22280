"""One hand-off of one ring, as the delivery history records it."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class Answer(StrEnum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    REJECTED = "rejected"
    ABANDONED = "abandoned"


@dataclass(frozen=True)
class Delivery:
    user_id: str
    reminder_id: uuid.UUID
    claim_due: datetime  # with reminder_id, the idempotency key of the ring
    claim_token: uuid.UUID | None
    claimed_at: datetime | None
    handed_off_at: datetime | None
    answer: Answer | None
    reason: str | None
    late: bool

    @property
    def lateness_ms(self) -> int | None:
        if self.handed_off_at is None:
            return None
        return int((self.handed_off_at - self.claim_due).total_seconds() * 1000)
