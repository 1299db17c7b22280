"""RFC 5545 section 3.8.5.3 examples (DTSTART in America/New_York), with their results."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from reminders_svc.schedule import load_zone, occurrences, parse_rrule

NEW_YORK = "America/New_York"


def d(year: int, month: int, day: int, hour: int = 9) -> datetime:
    return datetime(year, month, day, hour)


EXAMPLES = [
    ("FREQ=DAILY;COUNT=10", d(1997, 9, 2), [d(1997, 9, day) for day in range(2, 12)]),
    ("FREQ=DAILY;INTERVAL=10;COUNT=5", d(1997, 9, 2),
     [d(1997, 9, 2), d(1997, 9, 12), d(1997, 9, 22), d(1997, 10, 2), d(1997, 10, 12)]),
    ("FREQ=WEEKLY;COUNT=10", d(1997, 9, 2),
     [d(1997, 9, 2), d(1997, 9, 9), d(1997, 9, 16), d(1997, 9, 23), d(1997, 9, 30),
      d(1997, 10, 7), d(1997, 10, 14), d(1997, 10, 21), d(1997, 10, 28), d(1997, 11, 4)]),
    ("FREQ=WEEKLY;COUNT=10;WKST=SU;BYDAY=TU,TH", d(1997, 9, 2),
     [d(1997, 9, 2), d(1997, 9, 4), d(1997, 9, 9), d(1997, 9, 11), d(1997, 9, 16),
      d(1997, 9, 18), d(1997, 9, 23), d(1997, 9, 25), d(1997, 9, 30), d(1997, 10, 2)]),
    ("FREQ=WEEKLY;INTERVAL=2;UNTIL=19971224T000000Z;WKST=SU;BYDAY=MO,WE,FR", d(1997, 9, 1),
     [d(1997, 9, 1), d(1997, 9, 3), d(1997, 9, 5), d(1997, 9, 15), d(1997, 9, 17),
      d(1997, 9, 19), d(1997, 9, 29), d(1997, 10, 1), d(1997, 10, 3), d(1997, 10, 13),
      d(1997, 10, 15), d(1997, 10, 17), d(1997, 10, 27), d(1997, 10, 29), d(1997, 10, 31),
      d(1997, 11, 10), d(1997, 11, 12), d(1997, 11, 14), d(1997, 11, 24), d(1997, 11, 26),
      d(1997, 11, 28), d(1997, 12, 8), d(1997, 12, 10), d(1997, 12, 12), d(1997, 12, 22)]),
    ("FREQ=MONTHLY;COUNT=10;BYDAY=1FR", d(1997, 9, 5),
     [d(1997, 9, 5), d(1997, 10, 3), d(1997, 11, 7), d(1997, 12, 5), d(1998, 1, 2),
      d(1998, 2, 6), d(1998, 3, 6), d(1998, 4, 3), d(1998, 5, 1), d(1998, 6, 5)]),
    ("FREQ=MONTHLY;INTERVAL=2;COUNT=10;BYDAY=1SU,-1SU", d(1997, 9, 7),
     [d(1997, 9, 7), d(1997, 9, 28), d(1997, 11, 2), d(1997, 11, 30), d(1998, 1, 4),
      d(1998, 1, 25), d(1998, 3, 1), d(1998, 3, 29), d(1998, 5, 3), d(1998, 5, 31)]),
    ("FREQ=MONTHLY;COUNT=6;BYDAY=-2MO", d(1997, 9, 22),
     [d(1997, 9, 22), d(1997, 10, 20), d(1997, 11, 17), d(1997, 12, 22), d(1998, 1, 19),
      d(1998, 2, 16)]),
    ("FREQ=MONTHLY;BYMONTHDAY=-3", d(1997, 9, 28),
     [d(1997, 9, 28), d(1997, 10, 29), d(1997, 11, 28), d(1997, 12, 29), d(1998, 1, 29),
      d(1998, 2, 26)]),
    ("FREQ=MONTHLY;COUNT=10;BYMONTHDAY=2,15", d(1997, 9, 2),
     [d(1997, month, day) for month in (9, 10, 11, 12) for day in (2, 15)]
     + [d(1998, 1, 2), d(1998, 1, 15)]),
    ("FREQ=YEARLY;COUNT=10;BYMONTH=6,7", d(1997, 6, 10),
     [d(year, month, 10) for year in range(1997, 2002) for month in (6, 7)]),
    ("FREQ=MONTHLY;BYDAY=FR;BYMONTHDAY=13", d(1997, 9, 2),
     [d(1998, 2, 13), d(1998, 3, 13), d(1998, 11, 13), d(1999, 8, 13), d(2000, 10, 13)]),
    ("FREQ=MONTHLY;BYDAY=SA;BYMONTHDAY=7,8,9,10,11,12,13", d(1997, 9, 13),
     [d(1997, 9, 13), d(1997, 10, 11), d(1997, 11, 8), d(1997, 12, 13), d(1998, 1, 10),
      d(1998, 2, 7), d(1998, 3, 7), d(1998, 4, 11), d(1998, 5, 9), d(1998, 6, 13)]),
    ("FREQ=YEARLY;INTERVAL=4;BYMONTH=11;BYDAY=TU;BYMONTHDAY=2,3,4,5,6,7,8", d(1996, 11, 5),
     [d(1996, 11, 5), d(2000, 11, 7), d(2004, 11, 2)]),
    ("FREQ=MONTHLY;COUNT=3;BYDAY=TU,WE,TH;BYSETPOS=3", d(1997, 9, 4),
     [d(1997, 9, 4), d(1997, 10, 7), d(1997, 11, 6)]),
    ("FREQ=MONTHLY;BYDAY=MO,TU,WE,TH,FR;BYSETPOS=-2", d(1997, 9, 29),
     [d(1997, 9, 29), d(1997, 10, 30), d(1997, 11, 27), d(1997, 12, 30), d(1998, 1, 29),
      d(1998, 2, 26), d(1998, 3, 30)]),
    ("FREQ=YEARLY;BYDAY=20MO", d(1997, 5, 19), [d(1997, 5, 19), d(1998, 5, 18), d(1999, 5, 17)]),
    ("FREQ=YEARLY;BYMONTH=3;BYDAY=TH", d(1997, 3, 13),
     [d(1997, 3, 13), d(1997, 3, 20), d(1997, 3, 27), d(1998, 3, 5), d(1998, 3, 12),
      d(1998, 3, 19), d(1998, 3, 26), d(1999, 3, 4), d(1999, 3, 11), d(1999, 3, 18),
      d(1999, 3, 25)]),
    ("FREQ=WEEKLY;INTERVAL=2;COUNT=4;BYDAY=TU,SU;WKST=MO", d(1997, 8, 5),
     [d(1997, 8, 5), d(1997, 8, 10), d(1997, 8, 19), d(1997, 8, 24)]),
    ("FREQ=WEEKLY;INTERVAL=2;COUNT=4;BYDAY=TU,SU;WKST=SU", d(1997, 8, 5),
     [d(1997, 8, 5), d(1997, 8, 17), d(1997, 8, 19), d(1997, 8, 31)]),
    ("FREQ=MONTHLY;BYMONTHDAY=15,30;COUNT=5", d(2007, 1, 15),
     [d(2007, 1, 15), d(2007, 1, 30), d(2007, 2, 15), d(2007, 3, 15), d(2007, 3, 30)]),
    ("RRULE:FREQ=DAILY;UNTIL=20000131T140000Z;BYMONTH=1", d(1998, 1, 1),
     [d(year, 1, day) for year in (1998, 1999, 2000) for day in range(1, 32)]),
]  # fmt: skip


@pytest.mark.parametrize(("rrule", "start", "expected"), EXAMPLES)
def test_rfc5545_example(rrule: str, start: datetime, expected: list[datetime]) -> None:
    repeat = parse_rrule(rrule, NEW_YORK, start)
    rings = occurrences(repeat, datetime(1990, 1, 1, tzinfo=UTC), len(expected) + 5)
    if "COUNT" in rrule or "UNTIL" in rrule:
        assert len(rings) == len(expected)
    zone = load_zone(NEW_YORK)
    assert [ring.astimezone(zone).replace(tzinfo=None) for ring in rings[: len(expected)]] == (
        expected
    )


def test_rfc5545_daily_until_keeps_nine_local_through_the_change() -> None:
    repeat = parse_rrule("FREQ=DAILY;UNTIL=19971224T000000Z", NEW_YORK, d(1997, 9, 2))
    rings = occurrences(repeat, datetime(1997, 1, 1, tzinfo=UTC), 200)
    assert len(rings) == 113
    assert rings[0] == datetime(1997, 9, 2, 13, tzinfo=UTC)  # EDT
    assert rings[-1] == datetime(1997, 12, 23, 14, tzinfo=UTC)  # EST
