"""Reading an exposition in tests: the one helper over prometheus_client's own parsers."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text


@dataclass(frozen=True)
class Sample:
    """One sample: its full name (``_total``, ``_info`` included), labels and value."""

    name: str
    labels: Mapping[str, str]
    value: float


class Exposition:
    """A parsed /metrics body, queried by sample name and labels (as ``get_sample_value`` does)."""

    def __init__(self, text: str, *, openmetrics: bool = False) -> None:
        parse = parse_openmetrics if openmetrics else parse_text
        self.families = list(parse(text))
        self.samples = [Sample(s.name, dict(s.labels), s.value) for f in self.families for s in f.samples]

    def __iter__(self) -> Iterator[Metric]:
        """The families, as prometheus_client's parser gives them."""
        return iter(self.families)

    def __contains__(self, name: str) -> bool:
        return any(s.name == name for s in self.samples)

    def all(self, name: str, **labels: str) -> list[Sample]:
        """Every sample called ``name`` whose labels include ``labels``."""
        return [s for s in self.samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]

    def value(self, name: str, **labels: str) -> float | None:
        """The value of the one sample called ``name`` whose labels include ``labels``; None when there is none.

        More than one match is an error: name enough labels to pick one sample.
        """
        found = self.all(name, **labels)
        assert len(found) <= 1, f"{len(found)} samples of {name} match {labels}: {found}"
        return found[0].value if found else None

    def by(self, name: str, label: str) -> dict[str, float]:
        """``name``'s values keyed by one label's value."""
        return {s.labels[label]: s.value for s in self.all(name)}

    def names(self) -> set[str]:
        """The family names present."""
        return {f.name for f in self.families}
