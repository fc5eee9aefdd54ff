"""The Dagster code location's entry point: the one place the Dagster processes (webserver, daemon, code server,
run and step workers) build their settings, from the environment. A bad variable stops the load here, named in
one sentence (SettingsError)."""

from __future__ import annotations

from orchestration.code_location import build_definitions, build_resources
from orchestration.environment import enable_event_batches
from queue_db.config import Settings

__all__ = ["build_resources", "defs", "settings"]

# run workers launched by a daemon the docqueue CLI did not start still store event batches in one INSERT
enable_event_batches()

settings = Settings.from_env()
defs = build_definitions(settings)
