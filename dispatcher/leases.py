"""Part leases with epochs, expiring on the database's clock (DESIGN.md invariant 9).

Rules:
- `owner` is written with a TTL of the lease length, so a lease lapses on Cassandra's
  clock even if its holder is frozen; `epoch` never expires and grows with each new lease.
- Taking a part: `IF owner = null AND epoch = <read>`; every later write of the holder
  (renew, checkpoint, release) is `IF owner = me AND epoch = <mine>`, so a holder that
  lost its lease (expired, taken over) can write nothing.
- The holder also keeps a local deadline (monotonic, counted from before it sent the
  LWT, minus a margin): past it, it stops handing off even before it learns it lost.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cassandra.cluster import Session
from cassandra.query import BatchStatement, BatchType

from reminders_svc.storage import aio
from reminders_svc.storage.session import prepare_serial


@dataclass
class Lease:
    part: int
    epoch: int
    checkpoint: datetime | None  # last minute fully finished
    valid_until: float  # time.monotonic() deadline; local, conservative
    # Released, or known lost (a renewal or checkpoint refused): never held again.
    ended: bool = False

    def held(self) -> bool:
        return time.monotonic() < self.valid_until  # 0 once ended

    def end(self) -> None:
        self.ended = True
        self.valid_until = 0.0


@dataclass(frozen=True)
class PartState:
    part: int
    owner: str | None
    epoch: int
    checkpoint: datetime | None
    lease_until: datetime | None


class PartLeases:
    def __init__(
        self,
        session: Session,
        owner: str,
        lease: timedelta,
        renew_timeout: timedelta | None = None,
    ) -> None:
        self._session = session
        self.owner = owner
        self._lease_s = int(lease.total_seconds())
        # A frozen process must not act on a lease it may have lost: keep a margin.
        self._margin_s = max(1.0, self._lease_s / 5)
        # A renewal that hangs (a node that stopped answering) is given up in time for the
        # next one, not after the driver's request timeout, which may exceed the lease.
        self._renew_timeout_s = renew_timeout.total_seconds() if renew_timeout else None
        prepare = session.prepare
        self._heartbeat = prepare(
            "INSERT INTO dispatcher_members (scope, dispatcher_id, seen)"
            " VALUES ('dispatch', ?, toTimestamp(now())) USING TTL ?"
        )
        # Every tick of every dispatcher: prepared, so routed to a replica and not re-parsed.
        self._members = prepare(
            "SELECT dispatcher_id FROM dispatcher_members WHERE scope = 'dispatch'"
        )
        self._read = prepare(
            "SELECT part, owner, epoch, checkpoint, lease_until FROM dispatch_parts"
        )
        self._read_one = prepare_serial(
            session,
            "SELECT part, owner, epoch, checkpoint, lease_until FROM dispatch_parts WHERE part = ?",
        )
        self._take_owner = prepare(
            "UPDATE dispatch_parts USING TTL ? SET owner = ?, lease_until = ? WHERE part = ?"
            " IF owner = null AND epoch = ?"
        )
        self._take_epoch = prepare("UPDATE dispatch_parts SET epoch = ? WHERE part = ?")
        self._renew = prepare(
            "UPDATE dispatch_parts USING TTL ? SET owner = ?, lease_until = ? WHERE part = ?"
            " IF owner = ? AND epoch = ?"
        )
        self._checkpoint = prepare(
            "UPDATE dispatch_parts SET checkpoint = ? WHERE part = ? IF owner = ? AND epoch = ?"
        )
        self._release = prepare(
            "DELETE owner, lease_until FROM dispatch_parts WHERE part = ?"
            " IF owner = ? AND epoch = ?"
        )

    async def heartbeat(self) -> None:
        await aio.execute(self._session, self._heartbeat, (self.owner, self._lease_s))

    async def leave(self) -> None:
        await aio.execute(
            self._session,
            "DELETE FROM dispatcher_members WHERE scope = 'dispatch' AND dispatcher_id = %s",
            (self.owner,),
        )

    async def members(self) -> set[str]:
        rows = await aio.execute_all(self._session, self._members)
        return {row.dispatcher_id for row in rows} | {self.owner}

    async def states(self) -> list[PartState]:
        rows = await aio.execute_all(self._session, self._read)
        return [_state(row) for row in rows]

    async def try_take(self, part: int) -> Lease | None:
        row = (await aio.execute(self._session, self._read_one, (part,))).one()
        state = _state(row) if row is not None else PartState(part, None, 0, None, None)
        if state.owner is not None:
            return None
        started = time.monotonic()
        epoch = state.epoch + 1
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        batch.add(
            self._take_owner,
            (self._lease_s, self.owner, _until(self._lease_s), part, state.epoch or None),
        )
        batch.add(self._take_epoch, (epoch, part))

        async def settle() -> bool:
            # A take that landed unheard would otherwise leave the part unworked by anyone
            # (this process included) until its lease ran out.
            settled = (await aio.execute(self._session, self._read_one, (part,))).one()
            return settled is not None and (settled.owner, settled.epoch) == (self.owner, epoch)

        taken = aio.execute(self._session, batch)
        if not await aio.applied_or_settled(self._session, taken, settle):
            return None
        return Lease(part, epoch, state.checkpoint, started + self._lease_s - self._margin_s)

    async def renew(self, lease: Lease) -> bool:
        if lease.ended:
            return False
        started = time.monotonic()
        applied = (
            (
                await aio.execute(
                    self._session,
                    self._renew,
                    (
                        self._lease_s,
                        self.owner,
                        _until(self._lease_s),
                        lease.part,
                        self.owner,
                        lease.epoch,
                    ),
                    timeout_s=self._renew_timeout_s,
                )
            )
            .one()
            .applied
        )
        if not applied:
            lease.end()
        elif not lease.ended:  # released while the renewal was under way: stays ended
            lease.valid_until = started + self._lease_s - self._margin_s
        return bool(applied)

    async def checkpoint(self, lease: Lease, minute: datetime) -> bool:
        if not lease.held():
            return False
        applied = (
            (
                await aio.execute(
                    self._session, self._checkpoint, (minute, lease.part, self.owner, lease.epoch)
                )
            )
            .one()
            .applied
        )
        if applied:
            lease.checkpoint = minute
        else:
            lease.end()
        return bool(applied)

    async def release(self, lease: Lease) -> None:
        lease.end()
        await aio.execute(self._session, self._release, (lease.part, self.owner, lease.epoch))


def _until(seconds: int) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


def _state(row: object) -> PartState:
    get = row.__getattribute__
    checkpoint = get("checkpoint")
    lease_until = get("lease_until")
    return PartState(
        part=get("part"),
        owner=get("owner"),
        epoch=get("epoch") or 0,
        checkpoint=checkpoint.replace(tzinfo=UTC) if checkpoint else None,
        lease_until=lease_until.replace(tzinfo=UTC) if lease_until else None,
    )
