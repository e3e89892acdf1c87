"""One colour per meaning, for every picture on the page.

Purple is always model-local caches (declared, or held within a declaration); red is always memory no declaration
accounts for (unexplained growth, a cache above its declaration, a cache nobody declares). The other parts of an
engine's memory have a colour each that no other meaning uses.
"""

from __future__ import annotations

CACHES = "#8e44ad"
"""Model-local caches, as declared."""
CACHES_HELD = "#c39bd3"
"""What model-local caches were observed to hold, within their declaration."""
NOT_DECLARED = "#d64545"
"""Memory no declaration accounts for."""

PARTS = {
    "runtime": "#6b7280",
    "weights": "#4a78c2",
    "paged_kv": "#3b9a5b",
    "cuda_graphs": "#d9822b",
    "activation_peak": "#e0b43c",
    "model_local_caches": CACHES,
    "unexplained": NOT_DECLARED,
}
"""Each part of ``sidecar.breakdown``'s memory by part."""
