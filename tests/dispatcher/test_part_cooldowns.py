"""A part whose worker fails is kept from the dispatcher a while, longer at each failure
in a row: it was released and taken again every second, forever, while its rings
waited and the pod stayed ready."""

from __future__ import annotations

from dispatcher.service import PartCooldowns


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_failing_part_waits_longer_at_each_failure_in_a_row_up_to_five_minutes() -> None:
    clock = Clock()
    cooldowns = PartCooldowns(clock)
    waits = []
    for _ in range(9):
        waits.append(cooldowns.failed(3))
        assert cooldowns.cooling(3)
        assert not cooldowns.cooling(4)  # other parts are taken as before
        clock.now += waits[-1]
        assert not cooldowns.cooling(3)  # taken again once its wait is over
    assert waits == [5, 10, 20, 40, 80, 160, 300, 300, 300]


def test_a_failure_after_a_quiet_spell_waits_the_first_wait_again() -> None:
    clock = Clock()
    cooldowns = PartCooldowns(clock)
    for _ in range(4):
        clock.now += cooldowns.failed(0)
    clock.now += PartCooldowns.LONGEST_S + 1  # worked without failing since
    assert cooldowns.failed(0) == PartCooldowns.FIRST_S
