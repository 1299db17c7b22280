"""The samples the code exports: the API's, the dispatcher's and the notifier's metrics,
each made in a fresh registry of its own (no server started), with every labelled metric
given one child so that its samples, and so its label names, show.

Not the client's standard process_* and python_* metrics, which each process's registry
adds too (reminders_svc.runtime.process_registry): they are prometheus_client's, not this
code's, and neither the rules nor the dashboard need read them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from dispatcher.metrics import DispatcherMetrics
from notifier.metrics import NotifierMetrics
from reminders_svc.api.server import ApiMetrics

# Labels the scrape adds to every sample (Prometheus, and the operator's Pod/ServiceMonitor).
TARGET_LABELS = frozenset({"job", "instance", "namespace", "pod", "container", "service"})


@dataclass(frozen=True)
class Exported:
    # Sample name (with _total, _bucket, _count, _sum, _created) -> its label names.
    labels: dict[str, frozenset[str]]
    # Histogram sample name (..._bucket) -> the `le` values it exports, as written.
    buckets: dict[str, frozenset[str]]


@cache
def exported() -> Exported:
    registries = [CollectorRegistry() for _ in range(3)]
    owners: list[object] = [
        DispatcherMetrics(registries[0]),
        NotifierMetrics(registries[1]),
        ApiMetrics(registries[2]),
    ]
    for owner in owners:
        _give_every_metric_a_child(vars(owner).values())
    labels: dict[str, set[str]] = defaultdict(set)
    buckets: dict[str, set[str]] = defaultdict(set)
    for registry in registries:
        for family in registry.collect():
            for sample in family.samples:
                labels[sample.name].update(sample.labels)
                if "le" in sample.labels:
                    buckets[sample.name].add(sample.labels["le"])
    return Exported(
        {name: frozenset(names) for name, names in labels.items()},
        {name: frozenset(values) for name, values in buckets.items()},
    )


def _give_every_metric_a_child(attributes: Iterable[object]) -> None:
    for metric in attributes:
        if isinstance(metric, MetricWrapperBase):
            # prometheus_client keeps a parent's label names private; a parent without
            # children exports no sample at all.
            names: tuple[str, ...] = tuple(metric._labelnames)
            if names:
                metric.labels(*("probe" for _ in names))
