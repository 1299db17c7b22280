"""Worst-case cost of the time engine: the bad-input table and random rules.

Each case is timed (best of 3) from parsing to the first 10 rings, and printed as a ratio
against a trivial valid rule measured in the same run, so machines compare. The engine's
promise: no input takes more than 50 ms.

    .venv/bin/python bench/bench_schedule.py
"""

from __future__ import annotations

import contextlib
import random
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reminders_svc.schedule import ScheduleError, occurrences, parse_rrule
from reminders_svc.schedule.expand import _compile
from reminders_svc.schedule.zones import zone_names
from tests.schedule.test_bad_input import BAD_INPUTS

LIMIT_SECONDS = 0.050
SINCE = datetime(2000, 1, 1, tzinfo=UTC)
HOSTILE = [
    "FREQ=HOURLY;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO",
    "FREQ=HOURLY;INTERVAL=25;BYMONTH=2;BYMONTHDAY=29;BYHOUR=5",
    "FREQ=DAILY;INTERVAL=2;BYMONTH=2;BYMONTHDAY=29;BYDAY=SU",
    "FREQ=WEEKLY;INTERVAL=53;BYMONTH=2;BYDAY=MO",
    "FREQ=MONTHLY;INTERVAL=7;BYMONTHDAY=31;BYMONTH=2,4,6,9,11",
    "FREQ=YEARLY;BYDAY=53MO",
    "FREQ=YEARLY;INTERVAL=4;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO",
    "FREQ=HOURLY;INTERVAL=9999;BYMONTH=2;BYMONTHDAY=29",
    # BYSETPOS builds a whole period's candidates; COUNT walks from the start.
    "FREQ=YEARLY;BYDAY=MO,TU,WE,TH,FR,SA,SU;BYSETPOS=-1",
    "FREQ=YEARLY;COUNT=109;BYDAY=MO,TU,WE,TH,FR,SA,SU;BYSETPOS=-1",
    "FREQ=YEARLY;COUNT=13;BYDAY=MO,TU,WE,TH,FR,SA,SU;BYSETPOS=-1",
    "FREQ=YEARLY;COUNT=6;BYDAY=MO,TU,WE,TH,FR,SA,SU;BYSETPOS=366",
    "FREQ=HOURLY;INTERVAL=25;BYMONTH=2;BYMONTHDAY=29;BYHOUR=5;COUNT=1000",
    "FREQ=YEARLY;BYDAY=53MO;COUNT=1000",
]


def seconds(call: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(3):
        _compile.cache_clear()
        began = time.perf_counter()
        with contextlib.suppress(ScheduleError):
            call()
        best = min(best, time.perf_counter() - began)
    return best


def expand(text: str, zone: str, start: datetime) -> Callable[[], object]:
    return lambda: occurrences(parse_rrule(text, zone, start), SINCE, 10)


def random_rule(rng: random.Random) -> str:
    freq = rng.choice(["YEARLY", "MONTHLY", "WEEKLY", "DAILY", "HOURLY"])
    parts = [f"FREQ={freq}", f"INTERVAL={rng.choice([1, 2, 3, 7, 13, 48, 400])}"]
    if rng.random() < 0.6:
        parts.append("BYMONTH=" + ",".join(map(str, sorted(rng.sample(range(1, 13), 2)))))
    if freq != "WEEKLY" and rng.random() < 0.6:
        parts.append(f"BYMONTHDAY={rng.choice([-1, 1, 13, 29, 30, 31])}")
    if rng.random() < 0.6:
        ordinal = rng.choice(["", "1", "-1", "5"]) if freq in ("MONTHLY", "YEARLY") else ""
        parts.append(f"BYDAY={ordinal}{rng.choice(['MO', 'FR', 'SU'])}")
    if rng.random() < 0.5:
        parts.append(f"BYHOUR={rng.randrange(24)}")
    if rng.random() < 0.2:
        parts.append("BYSETPOS=-1")
    return ";".join(parts)


def main() -> int:
    start = datetime(2026, 10, 20, 8, 0)
    baseline = seconds(expand("FREQ=DAILY", "America/New_York", start))
    rng = random.Random(5545)
    zones = sorted(zone_names())
    cases: list[tuple[str, Callable[[], object]]] = [
        (f"bad: {name}", call) for name, call, _, _ in BAD_INPUTS
    ]
    cases += [(f"hostile: {text}", expand(text, "UTC", start)) for text in HOSTILE]
    for _ in range(300):
        text = random_rule(rng)
        cases.append((f"random: {text}", expand(text, rng.choice(zones), start)))
    timed = sorted(((seconds(call), name) for name, call in cases), reverse=True)
    print(f"baseline (FREQ=DAILY, 10 rings): {baseline * 1000:.3f} ms")
    print(f"cases: {len(timed)}; slowest, as ratio to baseline:")
    for cost, name in timed[:12]:
        print(f"  {cost / baseline:8.1f}x  {cost * 1000:7.2f} ms  {name}")
    over = [name for cost, name in timed if cost > LIMIT_SECONDS]
    print(f"over {LIMIT_SECONDS * 1000:.0f} ms: {len(over)}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
