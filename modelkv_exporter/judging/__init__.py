"""Judging a declaration from plain numbers: what the model author's check, ``check`` and the landing page share.

- ``verdicts``: ``judge``, the one verdict on whether an owner's caches hold what it declares;
- ``declaration_text``: a suggested declaration written as code a model author can paste.

Standard library and ``modelkv_exporter.contract`` only, so that ``testing`` (engine side), ``cli`` and
``sidecar`` all import it directly; engines never load it.
"""
