"""The device registry: one partition per user, one row per push token."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from cassandra.cluster import Session

from notifier.domain.model import MAX_DEVICES_PER_USER, Device, Platform, devices_beyond_cap
from reminders_svc.domain.errors import Unavailable
from reminders_svc.storage.aio import execute, execute_all
from reminders_svc.storage.session import prepare_serial

# Registrations of one token for different users at once: each compares the owner read.
_OWNER_ATTEMPTS = 5
# Registrations of a device removed again before they listed it (evicted by another).
_REGISTER_ATTEMPTS = 5


class DeviceStore:
    def __init__(self, session: Session, keyspace: str) -> None:
        self._session = session
        self._insert = session.prepare(
            f"INSERT INTO {keyspace}.devices (user_id, device_token, platform, registered_at)"
            " VALUES (?, ?, ?, toTimestamp(now())) IF NOT EXISTS"
        )
        self._refresh = session.prepare(
            f"UPDATE {keyspace}.devices SET platform = ?, registered_at = toTimestamp(now())"
            " WHERE user_id = ? AND device_token = ? IF EXISTS"
        )
        self._select_all = session.prepare(
            f"SELECT device_token, platform, registered_at FROM {keyspace}.devices"
            " WHERE user_id = ?"
        )
        self._delete = session.prepare(
            f"DELETE FROM {keyspace}.devices WHERE user_id = ? AND device_token = ? IF EXISTS"
        )
        self._owner = prepare_serial(
            session, f"SELECT user_id FROM {keyspace}.device_owners WHERE device_token = ?"
        )
        self._owners = session.prepare(
            f"SELECT device_token, user_id FROM {keyspace}.device_owners WHERE device_token IN ?"
        )
        self._first_owner = session.prepare(
            f"INSERT INTO {keyspace}.device_owners (device_token, user_id) VALUES (?, ?)"
            " IF NOT EXISTS"
        )
        self._next_owner = session.prepare(
            f"UPDATE {keyspace}.device_owners SET user_id = ? WHERE device_token = ? IF user_id = ?"
        )
        # Only while the user still owns it: a token taken by another user stays theirs.
        self._disown = session.prepare(
            f"DELETE FROM {keyspace}.device_owners WHERE device_token = ? IF user_id = ?"
        )
        # Only the registration that was listed: one refreshed since is in use, and stays.
        self._evict = session.prepare(
            f"DELETE FROM {keyspace}.devices WHERE user_id = ? AND device_token = ?"
            " IF registered_at = ?"
        )

    async def register(
        self, user_id: str, device: Device, attempts_left: int = _REGISTER_ATTEMPTS
    ) -> Device:
        """Idempotent per token; registering again refreshes its time (apps register
        their token as they start, as FCM advises: a fresh time says the device is in
        use) and its platform (a reinstall). Past the user's MAX_DEVICES_PER_USER, the
        least recently registered others go, unless registered again since they were
        listed: the user then keeps one device over the cap until a later registration
        lists the devices again (the one that refreshed it lists after this one's insert,
        so it evicts in its place)."""
        assert device.platform is not None, "validated by device_problem()"
        platform = device.platform.value
        token = device.device_token
        await self._own(user_id, token)
        row = (await execute(self._session, self._insert, (user_id, token, platform))).one()
        if not row.applied:
            await execute(self._session, self._refresh, (platform, user_id, token))
        if await self._owner_of(token) != user_id:
            # Another user's registration took the token between this one's owner write
            # and its row (a phone signed out of this user and into that one): that one's
            # removal found no row to delete, so this row goes now, or this user's
            # reminders would reach the other user's phone. Answered as registered and
            # then taken, the order the two could have run in.
            await execute(self._session, self._delete, (user_id, token))
            return Device(token, device.platform)
        # On every registration, not only a new token's: a user left over the cap (an
        # eviction cut short, rows from before the cap) is brought back under it.
        listed = await self.list(user_id)
        others = [d for d in listed if d.device_token != token]
        for old in devices_beyond_cap(others, keep=MAX_DEVICES_PER_USER - 1):
            await self.forget_listed(user_id, old)
        registered = next((d for d in listed if d.device_token == token), None)
        if registered is not None:
            return registered
        # Removed meanwhile (a concurrent eviction, or an unregistration): register again,
        # a bounded number of times.
        if attempts_left == 0:
            raise Unavailable.contention("this user's devices")
        return await self.register(user_id, device, attempts_left - 1)

    async def _owner_of(self, token: str) -> str | None:
        """The token's owner, read through Paxos (None: nobody's)."""
        row = (await execute(self._session, self._owner, (token,))).one()
        return None if row is None else str(row.user_id)

    async def _own(self, user_id: str, token: str) -> None:
        """Make `user_id` the token's owner, and take the token from its previous owner's
        devices (a phone signed in as another user). Run again by a retried registration
        when storage did not answer: the Paxos read then says where it stands. The token
        leaves the previous owner's devices first: a retry after a switch that landed
        finds this user the owner and returns, so a removal after the switch that failed
        left the token on both users' devices (and the other's reminders on this phone)."""
        for _ in range(_OWNER_ATTEMPTS):
            previous = await self._owner_of(token)
            if previous == user_id:
                return
            if previous is None:
                taken = await execute(self._session, self._first_owner, (token, user_id))
            else:
                await execute(self._session, self._delete, (previous, token))
                params = (user_id, token, previous)
                taken = await execute(self._session, self._next_owner, params)
            if taken.one().applied:
                return
        raise Unavailable.contention("this device token")

    async def list(self, user_id: str) -> tuple[Device, ...]:
        """The user's devices, but a token another user owns now: its row here outlived
        a removal that failed (an unregistration's, or a registration's of another user),
        and is removed when found, never pushed to (the other user's phone). A token with
        no owner row is the user's (rows from before owners were kept)."""
        # Every page: a user registered before the cap may hold more than one.
        rows = await execute_all(self._session, self._select_all, (user_id,))
        devices = tuple(_device(row) for row in rows)
        taken: set[str] = set()
        for start in range(0, len(devices), MAX_DEVICES_PER_USER):
            tokens = [d.device_token for d in devices[start : start + MAX_DEVICES_PER_USER]]
            owners = await execute_all(self._session, self._owners, (tokens,))
            taken.update(row.device_token for row in owners if row.user_id != user_id)
        for device in devices:
            if device.device_token in taken:
                # Only the row listed: the user registering the token again since has
                # taken it back, and keeps the row that registration refreshed.
                params = (user_id, device.device_token, device.register_time)
                await execute(self._session, self._evict, params)
        return tuple(d for d in devices if d.device_token not in taken)

    async def forget_listed(self, user_id: str, device: Device) -> None:
        """Remove `device` as it was listed (evicted past the cap, answered gone by its
        push service), and its owner row once the device row went: a registration of it
        since (the app started again, reinstalled with the same token) is in use, and stays
        with its owner. Idempotent."""
        params = (user_id, device.device_token, device.register_time)
        if (await execute(self._session, self._evict, params)).one().applied:
            await execute(self._session, self._disown, (device.device_token, user_id))

    async def remove(self, user_id: str, device_token: str) -> None:
        """Idempotent. LWTs, as register's writes are: an app that logs out and in
        again unregisters and registers the same token, and a plain delete's client
        timestamp could order after (and hide) that registration. The token's owner row
        goes too (first: a registration racing this one then re-owns the token before
        its device row is written, so no device row is left without its owner), or an
        account deleted would leave its tokens mapped to it for good."""
        await execute(self._session, self._disown, (device_token, user_id))
        await execute(self._session, self._delete, (user_id, device_token))

    async def remove_all(self, user_id: str) -> None:
        """Every device of the user, each by `remove`'s LWT, all at once. Idempotent.
        Not one partition delete: Cassandra refuses IF EXISTS there, and a plain
        tombstone stamped by this process's clock could shadow a later LWT registration's
        write (the LWT applies, yet its row stays hidden) when that clock runs ahead of
        the nodes'. Registration keeps a user to MAX_DEVICES_PER_USER, but one from
        before the cap may hold more, so the removals go in bounded groups."""
        devices = await self.list(user_id)
        for start in range(0, len(devices), MAX_DEVICES_PER_USER):
            group = devices[start : start + MAX_DEVICES_PER_USER]
            await asyncio.gather(*(self.remove(user_id, d.device_token) for d in group))


def _device(row: Any) -> Device:
    # The driver returns timestamps as naive UTC datetimes.
    registered: datetime | None = row.registered_at
    return Device(
        device_token=row.device_token,
        platform=Platform(row.platform),
        register_time=registered.replace(tzinfo=UTC) if registered is not None else None,
    )
