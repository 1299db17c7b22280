"""The device registry: one partition per user, one row per push token."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from cassandra.cluster import Session

from notifier.domain.model import Device, Platform, devices_beyond_cap
from reminders_svc.storage.aio import execute


class DeviceStore:
    def __init__(self, session: Session, keyspace: str) -> None:
        self._session = session
        self._insert = session.prepare(
            f"INSERT INTO {keyspace}.devices (user_id, device_token, platform, registered_at)"
            " VALUES (?, ?, ?, toTimestamp(now())) IF NOT EXISTS"
        )
        self._change_platform = session.prepare(
            f"UPDATE {keyspace}.devices SET platform = ?"
            " WHERE user_id = ? AND device_token = ? IF EXISTS"
        )
        self._select_one = session.prepare(
            f"SELECT device_token, platform, registered_at FROM {keyspace}.devices"
            " WHERE user_id = ? AND device_token = ?"
        )
        self._select_all = session.prepare(
            f"SELECT device_token, platform, registered_at FROM {keyspace}.devices"
            " WHERE user_id = ?"
        )
        self._delete = session.prepare(
            f"DELETE FROM {keyspace}.devices WHERE user_id = ? AND device_token = ? IF EXISTS"
        )

    async def register(self, user_id: str, device: Device) -> Device:
        """Idempotent per token: the first registration's time is kept; a token moving to
        another platform (a reinstall) takes the new one. A new token past the user's
        MAX_DEVICES_PER_USER makes the least recently registered ones go."""
        assert device.platform is not None, "validated by device_problem()"
        platform = device.platform.value
        token = device.device_token
        row = (await execute(self._session, self._insert, (user_id, token, platform))).one()
        if not row.applied and row.platform != platform:
            await execute(self._session, self._change_platform, (platform, user_id, token))
        stored = (await execute(self._session, self._select_one, (user_id, token))).one()
        if row.applied:
            for old in devices_beyond_cap(await self.list(user_id)):
                await self.remove(user_id, old.device_token)
        return _device(stored)

    async def list(self, user_id: str) -> tuple[Device, ...]:
        rows = await execute(self._session, self._select_all, (user_id,))
        return tuple(_device(row) for row in rows)

    async def remove(self, user_id: str, device_token: str) -> None:
        await execute(self._session, self._delete, (user_id, device_token))


def _device(row: Any) -> Device:
    # The driver returns timestamps as naive UTC datetimes.
    registered: datetime | None = row.registered_at
    return Device(
        device_token=row.device_token,
        platform=Platform(row.platform),
        register_time=registered.replace(tzinfo=UTC) if registered is not None else None,
    )
