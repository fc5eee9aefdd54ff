"""Asset keys docqueue renamed, and the step of `docqueue db upgrade` that carries their history to the new keys.

Dagster has no rename: a new key starts with no materializations, so a home written before the rename would show
every roll-up partition as missing while the old key lingers in the catalog beside it. The history moves instead:
the event log's rows, their tags, the asset-check executions and the asset's catalog row are re-keyed in place,
in bounded batches, so partitions, run links and timestamps stay as they were. The serialized events name the key
too (`{"__class__": "AssetKey", "path": [...]}`), and that fragment is rewritten with it. Dagster recomputes the
partition status cache of a re-keyed asset on its next read. Idempotent: a moved row no longer matches.
"""

from __future__ import annotations

import json

import sqlalchemy as sa

from orchestration.assets.rollups import rollup_asset_name
from queue_db.phases import PhaseRegistry

# what each roll-up asset was called before `<phase>_document_rollup`; a phase not listed was `document_<phase>`
FORMER_ROLLUP_NAMES = {"ocr": "document_ocr", "vector": "document_vector_index", "graphrag": "document_graphrag_index"}
# rows re-keyed per statement: the move of a large home is many short transactions, never one long one
BATCH_ROWS = 5_000


def renamed_assets(phases: PhaseRegistry) -> dict[str, str]:
    """Former asset name -> current one, for every phase of `phases`."""
    return {FORMER_ROLLUP_NAMES.get(spec.name, f"document_{spec.name}"): rollup_asset_name(spec) for spec in phases}


def _key_column(name: str) -> str:
    """How the event log's `asset_key` columns spell a one-part key (AssetKey.to_string)."""
    return json.dumps([name])


def _key_json(name: str) -> str:
    """How serialized events spell a one-part key (Dagster's serdes: json.dumps with default separators)."""
    return '"path": ' + json.dumps([name])


def former_keys_with_history(engine: sa.engine.Engine, renames: dict[str, str]) -> list[str]:
    """The former names that still hold history in the event log (`docqueue db status` reports them)."""
    with engine.connect() as conn:
        return [
            old
            for old in renames
            if conn.execute(
                sa.text(
                    "SELECT 1 FROM asset_keys WHERE asset_key = :k "
                    "UNION ALL SELECT 1 FROM event_logs WHERE asset_key = :k LIMIT 1"
                ),
                {"k": _key_column(old)},
            ).first()
        ]


def _move_in_batches(conn, sql: str, params: dict) -> int:
    moved = 0
    while True:
        count = conn.execute(sa.text(sql), {**params, "batch": BATCH_ROWS}).rowcount
        conn.commit()
        moved += count
        if count < BATCH_ROWS:
            return moved


def carry_history(engine: sa.engine.Engine, renames: dict[str, str]) -> dict[str, int]:
    """Re-key the history of every former name in `renames` to its new name; returns the events moved per former
    name (materializations, observations, check evaluations; 0 where there was nothing to move)."""
    moved: dict[str, int] = {}
    with engine.connect() as conn:
        for old, new in renames.items():
            params = {
                "old": _key_column(old),
                "new": _key_column(new),
                "old_json": _key_json(old),
                "new_json": _key_json(new),
            }
            moved[old] = _move_in_batches(
                conn,
                "UPDATE event_logs SET asset_key = :new, event = replace(event, :old_json, :new_json) "
                "WHERE id IN (SELECT id FROM event_logs WHERE asset_key = :old LIMIT :batch)",
                params,
            )
            _move_in_batches(
                conn,
                "UPDATE asset_event_tags SET asset_key = :new "
                "WHERE id IN (SELECT id FROM asset_event_tags WHERE asset_key = :old LIMIT :batch)",
                params,
            )
            moved[old] += _move_check_executions(conn, params)
            _move_catalog_row(conn, params)
    return moved


def _move_check_executions(conn, params: dict) -> int:
    """The asset's check executions, and the evaluation events they point at (Dagster stores those without the
    event log's `asset_key` column: the execution row's storage id is the one way to them short of a scan)."""
    rewritten = 0
    while True:
        rows = conn.execute(
            sa.text(
                "SELECT id, evaluation_event_storage_id FROM asset_check_executions WHERE asset_key = :old LIMIT :batch"
            ),
            {**params, "batch": BATCH_ROWS},
        ).all()
        if not rows:
            return rewritten
        events = [event_id for _, event_id in rows if event_id is not None]
        conn.execute(
            sa.text(
                "UPDATE asset_check_executions SET asset_key = :new, "
                "evaluation_event = replace(evaluation_event, :old_json, :new_json) WHERE id = ANY(:ids)"
            ),
            {**params, "ids": [row_id for row_id, _ in rows]},
        )
        if events:
            rewritten += conn.execute(
                sa.text("UPDATE event_logs SET event = replace(event, :old_json, :new_json) WHERE id = ANY(:ids)"),
                {**params, "ids": events},
            ).rowcount
        conn.commit()


def _move_catalog_row(conn, params: dict) -> None:
    """The asset's row in `asset_keys`: renamed when the new key has none yet, else dropped in favour of the new
    key's; either way the new key's cached partition status is cleared, since it now covers more events."""
    has_new = conn.execute(sa.text("SELECT 1 FROM asset_keys WHERE asset_key = :new"), params).first()
    if has_new:
        conn.execute(sa.text("DELETE FROM asset_keys WHERE asset_key = :old"), params)
    else:
        conn.execute(
            sa.text(
                "UPDATE asset_keys SET asset_key = :new, "
                "last_materialization = replace(last_materialization, :old_json, :new_json) "
                "WHERE asset_key = :old"
            ),
            params,
        )
    conn.execute(sa.text("UPDATE asset_keys SET cached_status_data = NULL WHERE asset_key = :new"), params)
    conn.commit()
