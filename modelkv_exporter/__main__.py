"""``python -m modelkv_exporter``."""

from modelkv_exporter.cli import main

raise SystemExit(main())
