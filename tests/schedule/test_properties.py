"""Random rules and zones (hypothesis, derandomized so CI does not flake).

Local expansion is checked against dateutil.rrule (an independent implementation) in
UTC, where local time is UTC; in real zones the rings must strictly increase, each be
the mapped local candidate, and next_after must walk the same rings occurrences lists.
"""

from __future__ import annotations

import itertools
from collections import Counter
from datetime import UTC, date, datetime, time, timedelta

from dateutil import rrule as dateutil_rrule
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from reminders_svc.schedule import ScheduleError, next_after, occurrences, parse_rrule
from reminders_svc.schedule.expand import (
    _Budget,
    _period_key,
    local_occurrences,
    make_plan,
    most_times_in_period,
)
from reminders_svc.schedule.rule import Freq, parse_rule_text
from reminders_svc.schedule.zones import load_zone, to_local, zone_names

FREQS = ("YEARLY", "MONTHLY", "WEEKLY", "DAILY", "HOURLY")
CODES = ("MO", "TU", "WE", "TH", "FR", "SA", "SU")
SETTINGS = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


def _listed(values: st.SearchStrategy[int], name: str) -> st.SearchStrategy[str]:
    return st.sets(values, min_size=1, max_size=3).map(
        lambda chosen: f"{name}=" + ",".join(str(value) for value in sorted(chosen))
    )


@st.composite
def rules(draw: st.DrawFn) -> str:
    freq = draw(st.sampled_from(FREQS))
    parts = [f"FREQ={freq}"]
    optional = {
        "INTERVAL": st.integers(1, 12).map(lambda n: f"INTERVAL={n}"),
        "BYMONTH": _listed(st.integers(1, 12), "BYMONTH"),
        "BYHOUR": _listed(st.integers(0, 23), "BYHOUR"),
        "BYMINUTE": st.integers(0, 59).map(lambda n: f"BYMINUTE={n}"),
        "WKST": st.sampled_from(CODES).map(lambda code: f"WKST={code}"),
    }
    if freq != "WEEKLY":
        optional["BYMONTHDAY"] = _listed(
            st.integers(-31, 31).filter(lambda n: n != 0), "BYMONTHDAY"
        )
    # dateutil intersects plain and ordinal BYDAY where RFC 5545 unites them: draw one kind.
    if freq in ("MONTHLY", "YEARLY") and draw(st.booleans()):
        ordinal = st.sampled_from((-2, -1, 1, 2, 3, 4))
        optional["BYDAY"] = st.lists(
            st.tuples(ordinal, st.sampled_from(CODES)), min_size=1, max_size=2, unique=True
        ).map(lambda days: "BYDAY=" + ",".join(f"{n}{code}" for n, code in days))
    else:
        optional["BYDAY"] = st.sets(st.sampled_from(CODES), min_size=1, max_size=4).map(
            lambda codes: "BYDAY=" + ",".join(sorted(codes))
        )
    for strategy in optional.values():
        if draw(st.booleans()):
            parts.append(draw(strategy))
    if any(part.startswith("BY") for part in parts) and draw(st.integers(0, 4)) == 0:
        parts.append(draw(_listed(st.sampled_from((-2, -1, 1, 2, 3)), "BYSETPOS")))
    return ";".join(parts)


starts = st.datetimes(datetime(1995, 1, 1), datetime(2035, 12, 31)).map(
    lambda moment: moment.replace(second=0, microsecond=0)
)


# dateutil walks hourly rules hour by hour, far too slowly for sparse ones: not HOURLY here.
@SETTINGS
@given(rule_text=rules().filter(lambda text: not text.startswith("FREQ=HOURLY")), start=starts)
def test_local_expansion_matches_dateutil(rule_text: str, start: datetime) -> None:
    rule = parse_rule_text(rule_text, load_zone("UTC"))
    plan = make_plan(rule, start)
    try:
        mine = list(local_occurrences(plan, start, date(start.year + 1, 12, 31), _Budget()))
    except ScheduleError:
        reject()  # too sparse for the step budget: refused, not wrong
    if not mine and "BYSETPOS" in rule_text:
        return  # dateutil ignores UNTIL while BYSETPOS picks nothing and walks to year 9999
    end = f";UNTIL={start.year + 1}1231T235959"
    try:
        reference = list(dateutil_rrule.rrulestr(rule_text + end, dtstart=start))
    except ValueError:  # dateutil refuses what it finds empty (e.g. HOURLY INTERVAL vs BYHOUR)
        reference = []
    if rule.freq is Freq.WEEKLY and rule.by_set_pos:
        # In the start's week dateutil counts BYSETPOS among the days from the start on;
        # RFC 5545 (and the engine) among the whole week: compare from the next week.
        week_began = start.date() - timedelta(days=(start.weekday() - rule.week_start) % 7)
        next_week = datetime.combine(week_began + timedelta(days=7), time(0))
        mine = [ring for ring in mine if ring >= next_week]
        reference = [ring for ring in reference if ring >= next_week]
    assert mine[:12] == reference[:12]


@settings(SETTINGS, max_examples=100)
@given(rule_text=rules().filter(lambda text: "BYSETPOS" not in text), start=starts)
def test_no_period_holds_more_times_than_a_set_position_may_pick(
    rule_text: str, start: datetime
) -> None:
    """BYSETPOS positions past `most_times_in_period` are refused as never picking: no
    period may hold more candidates (the count is exact: the refusals in
    test_bad_input name rules it is the most for)."""
    plan = make_plan(parse_rule_text(rule_text, load_zone("UTC")), start)
    budget = _Budget()
    sizes: Counter[tuple[int, ...]] = Counter()
    try:
        for local in local_occurrences(plan, start, date(start.year + 1, 12, 31), budget):
            sizes[_period_key(plan, local)] += 1
            budget.steps = 0
    except ScheduleError:
        reject()  # too sparse for the step budget
    assert max(sizes.values(), default=0) <= most_times_in_period(plan)


def test_weekly_bysetpos_counts_the_whole_first_week_as_rfc_5545_does() -> None:
    """From a Wednesday, the 3rd of (Mon, Tue, Sat) in that week is the Saturday; dateutil
    counts only Wednesday on (Sat alone) and has no 3rd, so it starts a week later."""
    start = datetime(2001, 9, 5, 9, 0)  # a Wednesday
    rule = parse_rule_text("FREQ=WEEKLY;BYDAY=MO,TU,SA;BYSETPOS=3", load_zone("UTC"))
    rings = local_occurrences(make_plan(rule, start), start, date(2001, 12, 31), _Budget())
    assert next(iter(rings)) == datetime(2001, 9, 8, 9, 0)


@SETTINGS
@given(
    rule_text=rules(),
    start=starts,
    zone=st.sampled_from(sorted(zone_names())),
)
def test_rings_in_any_zone_increase_and_resume(rule_text: str, start: datetime, zone: str) -> None:
    try:
        repeat = parse_rrule(rule_text, zone, start)
    except ScheduleError:
        reject()  # never occurs, or too sparse: refused with an error, not checked
    since = datetime(1990, 1, 1, tzinfo=UTC)
    rings = occurrences(repeat, since, 8)
    assert rings, "a parsed repeat must ring"
    assert all(earlier < later for earlier, later in itertools.pairwise(rings))
    assert all(ring.tzinfo is UTC and ring.microsecond == 0 for ring in rings)
    walked = [rings[0]]
    for _ in rings[1:]:
        following = next_after(repeat, walked[-1])
        assert following is not None
        walked.append(following)
    assert walked == rings
    zone_info = load_zone(zone)
    for ring in rings:
        wall = to_local(ring, zone_info)
        assert wall >= repeat.start or wall.minute == repeat.start.minute
