"""The tokenizer the monitoring checks rely on: it must find every metric and nothing else."""

from __future__ import annotations

import pytest

from tests.monitoring.promql import Matcher, PromQLError, Selector, parse


@pytest.mark.parametrize(
    ("expr", "metrics"),
    [
        ("up", {"up"}),
        ("rate(a_total[5m])", {"a_total"}),
        ("sum by (le) (rate(a_bucket[$__rate_interval]))", {"a_bucket"}),
        ("sum(rate(a_total[5m])) without (instance) / ignoring(code) b", {"a_total", "b"}),
        ("histogram_quantile(0.99, sum by (le, method) (rate(h_bucket[1h30m])))", {"h_bucket"}),
        ("a > bool 1e3 and on(pod) group_left(x) b unless c offset 5m or d @ start()", set("abcd")),
        ("max_over_time(x[1h:5m]) - scalar(y) * vector(64) + Inf - NaN", {"x", "y"}),
        ('{__name__="named", job=~"a|b"} / atan2 e', {"named", "e"}),
        ('label_replace(m, "dst", "$1", "src", "(.*)") # a comment names no metric', {"m"}),
        ("abs(reminders:recorded:ratio_rate5m) > 0.5", {"reminders:recorded:ratio_rate5m"}),
        ("topk(5, sum by (outcome) (r_total))", {"r_total"}),
    ],
)
def test_finds_exactly_the_metrics(expr: str, metrics: set[str]) -> None:
    assert parse(expr).metrics == metrics


def test_reads_matchers_and_grouping_labels() -> None:
    expression = parse(
        r'sum by (code) (rate(req_total{code=~"A|B", method!="x"}[5m]))'
        r' / on(job) group_right(pod) h_bucket{le=~"60(\\.0)?"}'
    )
    assert expression.selectors == (
        Selector("req_total", (Matcher("code", "=~", "A|B"), Matcher("method", "!=", "x"))),
        Selector("h_bucket", (Matcher("le", "=~", r"60(\.0)?"),)),
    )
    assert expression.grouping == {"code", "job", "pod"}


@pytest.mark.parametrize(
    "expr",
    [
        "rate(a[5m]) ; b",  # a character PromQL does not have
        '{job="x"}',  # no metric name to check
        "a{code=5}",  # a matcher's value must be a string
        "sum by (code a",  # an unclosed label list
        "rate(a[5m)",  # an unclosed range
        'a{code="x" method="y"}',  # matchers without a comma
    ],
)
def test_refuses_what_it_cannot_read(expr: str) -> None:
    with pytest.raises(PromQLError):
        parse(expr)
