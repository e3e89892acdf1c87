"""The overview dashboard marks every engine that died, from the ended series, at the time it died."""

from __future__ import annotations

from dashboards import generate
from modelkv_exporter.sidecar.catalogue import CATALOGUE


def test_the_engine_ends_annotation_reads_the_ended_series_at_its_value() -> None:
    (annotation,) = generate.overview()["annotations"]["list"]
    assert annotation["name"] == "Engine ends" and annotation["enable"] is True
    expr = annotation["target"]["expr"]
    assert expr == f"modelkv_engine_ended_timestamp_seconds{{{generate.ENGINE_SELECTOR}}}"
    assert expr.split("{")[0] in CATALOGUE
    assert annotation["useValueForTime"] is True, "marked when the engine died, not over the hour it is exported"
    assert "{{reason}}" in annotation["titleFormat"] and annotation["tagKeys"] == "reason"
    assert annotation["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
