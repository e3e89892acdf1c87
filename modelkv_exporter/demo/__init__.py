"""The demo engines: several engine processes publishing real declarations (the ``demo`` command serves them).

- ``owners``: cache owners with the geometries of vLLM-Omni's known declarers, holding real caches;
- ``engines``: the demo engine processes, each publishing like a real engine.

Built on the engine side and the protocol (torch and transformers); the command that runs
them is the CLI's (``cli/demo.py``).
"""
