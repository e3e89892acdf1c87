"""The sidecar: the spool's snapshots as Prometheus metrics, a landing page and a JSON API over HTTP.

Builds on ``modelkv_exporter.contract`` and on prometheus_client, FastAPI and uvicorn; never
on torch, vLLM or the engine side. The CLI's ``inspect`` and ``plan`` read a spool with it too.

- ``reader``: untrusted spool files to snapshots, within limits, and each engine's state;
- ``budget``: what the sidecar admits from the spool; ``source``: the spool as the sidecar sees
  it at an instant (scan, admission, classification);
- ``catalogue``: every metric the exporter emits, in one table; ``label_values``: the label values only it speaks;
- ``attention``: what about an engine needs a person's attention, in one wording;
- ``growth``: an engine's growth since its baseline by part, judged as the leak rule judges it;
- ``breakdown``: where an engine's memory goes, part by part, from its snapshot's figures;
- ``capacity``: the peak of an engine's model-local caches at any max_num_seqs, and the largest that fits in a cache
  memory (``plan``'s arithmetic); ``prescription``: the KV cache memory to give vLLM so that the engine fits its
  memory;
- ``post_mortem``: why an engine died (ended with a reason, or vanished) and its memory then, in one definition;
- ``discovered``: which discovered owners are exported, and how a discovered layout is written as a label;
- ``labels`` and ``samples``: an engine's snapshot as label values and samples;
- ``collector``: a prometheus_client collector over the spool (the reference rendering);
- ``exposition``: /metrics rendered once per spool change, content negotiation, gzip;
- ``presentation``: the spool for people: one report per engine, built once, the landing page that draws it, and
  what clients may see (``inspect`` prints the same report);
- ``http``: transport: the sidecar's configuration, the FastAPI app, its one router, the JSON document, the page
  cache, the uvicorn server;
- ``sidecar_log``: rate-limited logging.
"""
