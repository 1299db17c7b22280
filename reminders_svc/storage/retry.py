"""The driver's retry policy, minus re-sending a lightweight transaction on a broken connection.

The driver's default re-sends any request whose connection broke to the next node. For
a compare-and-set that is wrong: the first attempt may have landed, and its re-send then
fails its own condition, so a claim, finalize, edit or notifier key that did land reads as
lost (a ring delayed by a claim lease, an edit answered ABORTED, a key answered duplicate
and never pushed). Instead the broken connection is surfaced, `aio.outcome_unknown` says
so, and the caller settles it with a SERIAL read, as for a timeout. Reads and plain writes
(idempotent: a re-send carries the same write timestamp) are re-sent as before.
"""

from __future__ import annotations

import re
from typing import Any

from cassandra.connection import ConnectionException
from cassandra.policies import RetryPolicy
from cassandra.protocol import ServerError
from cassandra.query import BatchStatement, BoundStatement

_CONDITION = re.compile(r"\bIF\b", re.IGNORECASE)


def is_conditional(statement: Any) -> bool:
    """A compare-and-set: a statement with an IF clause, or a batch (ours may hold one)."""
    if isinstance(statement, BatchStatement):
        return True
    if isinstance(statement, BoundStatement):
        statement = statement.prepared_statement
    return bool(_CONDITION.search(str(getattr(statement, "query_string", statement))))


class NoConditionalResend(RetryPolicy):  # type: ignore[misc]  # the driver is untyped
    def on_request_error(
        self, query: Any, consistency: Any, error: Any, retry_num: int
    ) -> tuple[int, Any]:
        # Overloaded and bootstrapping nodes refused the request: re-sending is safe.
        if isinstance(error, ConnectionException | ServerError) and is_conditional(query):
            return self.RETHROW, None
        decision: tuple[int, Any] = super().on_request_error(query, consistency, error, retry_num)
        return decision
