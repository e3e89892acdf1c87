"""The spool for people: one neutral report built once, and the page that draws it (``inspect`` prints it too).

- ``report``: per engine, its facts, status, findings, tables, bars, memory by part and growth, in plain text;
- ``wording``: the legends and the words both renderers share; ``palette``: one colour per meaning;
- ``page``: the landing page in HTML; ``owner_chart`` and ``parts_chart``: its pictures of an engine;
- ``public``: what clients are shown of the spool: visible text, no paths, no OS errors.
"""
