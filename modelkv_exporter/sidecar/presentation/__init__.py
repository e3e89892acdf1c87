"""The spool for people and scripts: one neutral report built once, and the documents that show it.

- ``spool_report``: per engine, its facts, status, findings, tables, bars, memory by part and growth, in plain
  text (the landing page draws it, and ``inspect`` prints it);
- ``wording``: the legends and the words both renderers share; ``palette``: one colour per meaning;
- ``page``: the landing page in HTML; ``owner_chart`` and ``parts_chart``: its pictures of an engine;
- ``engines_document``: the JSON document of ``/api/v1/engines``;
- ``safe_text``: text that is safe to show: unprintable characters escaped, no paths, no OS errors.
"""
