"""The delivery-history use case: a reminder's rings, for its owner only."""

from __future__ import annotations

import uuid
from datetime import datetime

from reminders_svc.app import RemindersApp
from reminders_svc.domain.delivery import Delivery
from reminders_svc.storage.history import DeliveryHistory


class DeliveryRecords:
    def __init__(self, app: RemindersApp, history: DeliveryHistory) -> None:
        self._app = app
        self._history = history

    async def page(
        self, user_id: str, reminder_id: uuid.UUID, before: datetime | None, size: int
    ) -> tuple[list[Delivery], datetime | None]:
        """Newest first, strictly before `before`; the page and the next cursor. NotFound,
        as every call says it, for a reminder the caller does not own."""
        await self._app.get(user_id, reminder_id)
        return await self._history.list_page(user_id, reminder_id, before, size)
