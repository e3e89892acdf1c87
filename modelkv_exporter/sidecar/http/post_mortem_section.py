"""The landing page's post-mortem of an engine that died: the first thing its section in "Needs attention" shows.

Why it ended and when, the error, what grew since its baseline by part with the part that grew most first, its memory
by part at that moment, torch's free reserved bytes and largest segments: ``sidecar.post_mortem``'s lines, which
``inspect`` prints too.
"""

from __future__ import annotations

from collections.abc import Callable

from modelkv_exporter.sidecar.post_mortem import PostMortem, post_mortem_lines

Escape = Callable[[str], str]


def post_mortem_html(dead: PostMortem, escape: Escape) -> str:
    """The post-mortem as a small table, every value escaped."""
    rows = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in post_mortem_lines(dead))
    return f'<div class="post-mortem"><p class="what"><strong>Post-mortem</strong></p><table>{rows}</table></div>'
