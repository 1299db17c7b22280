"""k8s/monitoring/reminders-dashboard.json: a Grafana dashboard on the Prometheus data source
chosen by its variable, showing every metric the code exports, and nothing it does not."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.monitoring.exported import exported
from tests.monitoring.files import Query, dashboard, dashboard_queries, panels, problems_with
from tests.monitoring.promql import parse

_DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
_SAMPLE_SUFFIX = re.compile(r"_(total|created|bucket|count|sum)$")


def _drawn() -> list[dict[str, Any]]:
    return [panel for panel in panels() if panel["type"] != "row"]


def test_is_a_dashboard_with_a_data_source_variable() -> None:
    document = dashboard()
    assert document["uid"]
    assert document["title"]
    variables = document["templating"]["list"]
    assert {"name": "datasource", "type": "datasource", "query": "prometheus"}.items() <= (
        next(v for v in variables if v["name"] == "datasource").items()
    )


def test_panels_have_unique_ids_and_do_not_overlap() -> None:
    ids = [panel["id"] for panel in panels()]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in panels():
        box = panel["gridPos"]
        assert box["x"] + box["w"] <= 24, panel["title"]
        covered = {
            (x, y)
            for x in range(box["x"], box["x"] + box["w"])
            for y in range(box["y"], box["y"] + box["h"])
        }
        assert not covered & cells, panel["title"]
        cells |= covered


@pytest.mark.parametrize("panel", _drawn(), ids=lambda panel: panel["title"])
def test_panel_queries_the_variable_s_data_source(panel: dict[str, Any]) -> None:
    assert panel["datasource"] == _DATASOURCE
    assert panel["targets"]
    ref_ids = [target["refId"] for target in panel["targets"]]
    assert len(ref_ids) == len(set(ref_ids))
    for target in panel["targets"]:
        assert target["datasource"] == _DATASOURCE
        assert target["expr"].strip()


@pytest.mark.parametrize("query", dashboard_queries(), ids=lambda q: f"{q.where}: {q.expr}")
def test_reads_only_what_the_code_exports(query: Query) -> None:
    assert problems_with(query) == []


def test_shows_every_metric_the_code_exports() -> None:
    families = {_SAMPLE_SUFFIX.sub("", name) for name in exported().labels}
    shown = {
        _SAMPLE_SUFFIX.sub("", metric)
        for query in dashboard_queries()
        for metric in parse(query.expr).metrics
    }
    assert families - shown == set()
