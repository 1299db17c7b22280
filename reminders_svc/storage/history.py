"""Delivery history: per user, reminder and ring, newest first, kept for a TTL."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

from cassandra.cluster import Session
from cassandra.query import UNSET_VALUE

from reminders_svc.domain.delivery import Answer, Delivery
from reminders_svc.storage import aio
from reminders_svc.storage.rows import utc

_FAR_FUTURE = datetime(9999, 12, 31)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class DeliveryHistory:
    def __init__(self, session: Session, retention: timedelta = timedelta(days=90)) -> None:
        self._session = session
        self._ttl = int(retention.total_seconds())
        self._page = session.prepare(
            "SELECT user_id, reminder_id, claim_due, claim_token, claimed_at, handed_off_at,"
            " answer, reason, late FROM deliveries"
            " WHERE user_id = ? AND reminder_id = ? AND claim_due < ? LIMIT ?"
        )
        # Stamped with the database's time as the dispatcher knows it (never ahead of it),
        # not by its host's clock, which may run ahead within the clock bound: a removal
        # that comes after the record (a ring's `forget`, an operator's purge) must cover it.
        self._record = session.prepare(
            "UPDATE deliveries USING TTL ? AND TIMESTAMP ? SET claim_token = ?, claimed_at = ?,"
            " handed_off_at = ?, answer = ?, reason = ?, lateness_ms = ?, late = ?"
            " WHERE user_id = ? AND reminder_id = ? AND claim_due = ?"
        )
        self._record_first = session.prepare(
            "INSERT INTO deliveries (claim_token, claimed_at, handed_off_at, answer, reason,"
            " lateness_ms, late, user_id, reminder_id, claim_due)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS USING TTL ?"
        )
        # By LWT: a record an LWT wrote (`_record_first`) carries the database's time, which
        # a plain delete stamped by a host clock behind it would not cover.
        self._forget = session.prepare(
            "DELETE FROM deliveries WHERE user_id = ? AND reminder_id = ? AND claim_due = ?"
            " IF EXISTS"
        )
        self._purge = session.prepare("DELETE FROM deliveries USING TIMESTAMP ? WHERE user_id = ?")

    async def record(
        self, delivery: Delivery, *, written_at: datetime, keep_earlier: bool = False
    ) -> None:
        """Record one ring's hand-off, at `written_at` (the database's time, not ahead of
        it: the record's write timestamp). `keep_earlier`: an earlier record under the same key
        (claim_due), if any, is left as it is. For a ring taken over from an earlier
        attempt, that attempt's record was the delivery the user saw (when, and whether),
        and the later answer is only "duplicate" (or "abandoned", were the user to take over
        now); for a ring not handed off (missed, given up), a record of one that was (by
        a dispatcher that took it over meanwhile) stands. Both are rare (missed rings come
        after an outage, at the catch-up's pace), so they can afford a lightweight
        transaction."""
        # An absent value (nothing handed off: a ring missed or given up) is left unset, not
        # written null: a null is a tombstone cell that every read of the user's history
        # scans. The update is a ring's first attempt handed off, whose every column but the
        # reason is set; the rings with absent values record `keep_earlier`.
        values = tuple(UNSET_VALUE if value is None else value for value in self._values(delivery))
        if keep_earlier:
            await aio.execute(self._session, self._record_first, (*values, self._ttl))
        else:
            stamp = write_timestamp(written_at)
            await aio.execute(self._session, self._record, (self._ttl, stamp, *values))

    @staticmethod
    def _values(delivery: Delivery) -> tuple[object, ...]:
        """The columns in the statements' order: the values, then the row's key."""
        return (
            delivery.claim_token,
            delivery.claimed_at,
            delivery.handed_off_at,
            delivery.answer.value if delivery.answer else None,
            # Empty, not unset: it must clear the reason of an attempt recorded before (a
            # takeover's "duplicate" that a first attempt, paused, recorded after).
            delivery.reason or "",
            delivery.lateness_ms,
            delivery.late,
            delivery.user_id,
            delivery.reminder_id,
            delivery.claim_due,
        )

    async def list_page(
        self, user_id: str, reminder_id: uuid.UUID, before: datetime | None, limit: int
    ) -> tuple[list[Delivery], datetime | None]:
        """Newest first, strictly before `before`; returns the page and the next cursor."""
        params = (user_id, reminder_id, before or _FAR_FUTURE, limit + 1)
        rows = list(await aio.execute(self._session, self._page, params))
        page = [_delivery(row) for row in rows[:limit]]
        return page, page[-1].claim_due if len(rows) > limit else None

    async def forget(self, user_id: str, reminder_id: uuid.UUID, claim_due: datetime) -> None:
        """Remove one ring's record: its reminder's row was purged while it rang."""
        await aio.execute(self._session, self._forget, (user_id, reminder_id, claim_due))

    async def purge_user(self, user_id: str) -> int:
        # Counted without keeping them: one user's history may hold millions of rows.
        count = await aio.count_all(
            self._session, "SELECT reminder_id FROM deliveries WHERE user_id = %s", (user_id,)
        )
        # Stamped no earlier than the database's time: records are (`record`), and this
        # host's clock may run behind it; one written just before would outlive the purge.
        # The database's time is in milliseconds: one more is past it.
        database_now = await aio.database_now(self._session)
        stamp = max(write_timestamp(database_now) + 1000, now_timestamp())
        await aio.execute(self._session, self._purge, (stamp, user_id))
        return count


def write_timestamp(instant: datetime) -> int:
    """A write timestamp (microseconds since the epoch) of an aware instant."""
    return (instant - _EPOCH) // timedelta(microseconds=1)


def now_timestamp() -> int:
    """This host's clock as a write timestamp, as the driver stamps a write by default."""
    return time.time_ns() // 1000


def _delivery(row: object) -> Delivery:
    get = row.__getattribute__
    claim_due = utc(get("claim_due"))
    assert claim_due is not None
    answer = get("answer")
    return Delivery(
        user_id=get("user_id"),
        reminder_id=get("reminder_id"),
        claim_due=claim_due,
        claim_token=get("claim_token"),
        claimed_at=utc(get("claimed_at")),
        handed_off_at=utc(get("handed_off_at")),
        answer=Answer(answer) if answer else None,
        reason=get("reason") or None,
        late=bool(get("late")),
    )
