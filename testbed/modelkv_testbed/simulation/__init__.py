"""A small simulation of engines and devices that writes the rules' story tests.

``physics`` follows each engine's memory minute by minute (the runtime, weights, paged KV,
CUDA graph pools, activations and the caching allocator that keeps them, declared, observed and
discovered caches, leaks, vLLM's sleep mode, heartbeats, restarts) and each device's used memory
as the sum of the processes on it (those that publish nothing too), asserting the physical
relations and knowing what each part of the memory breakdown holds. ``render`` turns every engine's state into real
snapshots and lets the sidecar's own sample functions say which series it exports, then writes
them as promtool input. ``story`` is what a story is (engines, devices, what an operator expects,
its promtool file); ``stories`` holds one per situation (``stories_oncall`` those of issue 48's on-call
part, ``stories_leaks`` leaks seen from the floor of live tensors, ``stories_postmortem`` engines that die, issue
49's); ``replay`` replays them outside promtool
and judges an alert timeline, ``on_victoria`` on VictoriaMetrics and vmalert, ``on_promtool`` on
Prometheus's own rule engine with any share of the series (a shard) and any of the rule groups. ``generate`` writes
them to ``deploy/prometheus/tests/story-*.test.yaml``:

    python -m modelkv_testbed.simulation.generate
"""
