"""CLI commands over record folders: verify, inspect, compact (export is in cli.py)."""

from __future__ import annotations

from eagle_synth.cli import app  # noqa: F401  (commands register on it)
