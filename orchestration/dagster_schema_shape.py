"""Dagster storages that keep what they learned of their schema's shape.

Dagster's SQL storages ask the catalog whether a table or column of a later schema migration exists before many of
their reads and writes: every run event's write, and every run read, whether the runs table has its start and end
columns; every dynamic partition read and write whether the partitions table exists; every asset index read
whether the asset key table has its index columns. Each question is a reflection query on PostgreSQL's catalog
(SQLAlchemy's, tens of rows and a few milliseconds of both processes' CPU), and a run's process asked it on each
of its events.

A table or column that exists keeps existing while a process runs (Dagster's migrations only add them), so a "yes"
is kept for the storage's life; a "no" is asked again each time, so that a migration run beside a live process
(`dagster instance migrate`) is seen as soon as it lands.

dagster internals relied on (pinned with dagster-postgres, as orchestration.dagster_pooled_storage's): the
`has_*` methods below keep their names and arguments; tests/integration/test_dagster_instance.py counts the
catalog reads of a run's events.
"""

from __future__ import annotations

from typing import Any, Callable

# where a storage keeps the questions answered yes
KEPT = "_schema_shape_known"


def learned_shape(instance: Any) -> dict[str, frozenset[tuple]]:
    """What an instance's run and event log storages have learned of their schema, by role. A run's launcher hands it
    to the run's process (orchestration/run_process.py), whose storages, on the same database, then need not ask."""
    storages = {"runs": instance.run_storage, "event_log": instance.event_log_storage}
    return {role: frozenset(getattr(storage, KEPT, ())) for role, storage in storages.items()}


def seed(storage: Any, known: frozenset[tuple]) -> None:
    """Give `storage` answers another storage of the same database learned (a yes stays true)."""
    storage.__dict__.setdefault(KEPT, set()).update(known)


def _kept_yes(storage: Any, question: tuple, ask: Callable[[], bool]) -> bool:
    known: set[tuple] = storage.__dict__.setdefault(KEPT, set())
    if question in known:
        return True
    answer = bool(ask())
    if answer:
        known.add(question)
    return answer


class RunSchemaShape:
    """For a run storage: its columns and tables of later migrations, asked once."""

    def has_run_stats_index_cols(self) -> bool:
        return _kept_yes(self, ("run_stats_index_cols",), super().has_run_stats_index_cols)

    def has_bulk_actions_selector_cols(self) -> bool:
        return _kept_yes(self, ("bulk_actions_selector_cols",), super().has_bulk_actions_selector_cols)

    def has_backfill_id_column(self) -> bool:
        return _kept_yes(self, ("backfill_id_column",), super().has_backfill_id_column)

    def has_bulk_action_job_name_column(self) -> bool:
        return _kept_yes(self, ("bulk_action_job_name_column",), super().has_bulk_action_job_name_column)

    def has_backfill_tags_table(self) -> bool:
        return _kept_yes(self, ("backfill_tags_table",), super().has_backfill_tags_table)


class EventLogSchemaShape:
    """For an event log storage: its tables, and the asset key table's columns, asked once."""

    def has_table(self, table_name: str) -> bool:
        parent = super().has_table
        return _kept_yes(self, ("table", table_name), lambda: parent(table_name))

    def _has_asset_key_col_on_connection(self, conn: Any, column_name: str) -> bool:
        parent = super()._has_asset_key_col_on_connection
        return _kept_yes(self, ("asset_key_col", column_name), lambda: parent(conn, column_name))

    def has_asset_key_col(self, column_name: str) -> bool:
        parent = super().has_asset_key_col
        return _kept_yes(self, ("asset_key_col", column_name), lambda: parent(column_name))
