"""The claim statement of a task kind and the claim cursor a queue object keeps per kind: a claim by the claim rule
starts after the last task the object claimed (a row comparison the claim index seeks to) rather than at the
index's head, and from the head again at most claim_rescan_s apart. Transitions sends the statements and hands the
rows back here, where the cursor moves."""

from __future__ import annotations

import datetime
import functools
import time
from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence

from .phase_spec import TaskKind


class ClaimStatement(NamedTuple):
    """A claim to send: its statement and arguments; `full_at`, the time of a claim by the claim rule from the
    index's head (None otherwise); `after`, whether it starts after the cursor."""

    sql: str
    args: dict
    full_at: float | None = None
    after: bool = False


@dataclass
class ClaimCursor:
    """Where a queue object's next claim of a kind starts: after `after`, the claim key (TaskKind.claim_key) of the
    last task it claimed, until `full_at` (time.monotonic()) is claim_rescan_s old and a claim starts at the head
    again."""

    after: list
    full_at: float


# a claim's text depends on its kind and flags only, and a worker sends one per batch: built once (kinds are
# singletons, so the cache holds a handful of statements per phase)
@functools.lru_cache(maxsize=256)
def claim_sql(
    kind: TaskKind, *, only_ids: bool = False, override_retry_limit: bool = False, after: bool = False
) -> str:
    """The claim statement of `kind` ($1: {worker, limit, only, after}).

    A claim by the claim rule alone (no `only_ids`, no `override_retry_limit`) returns each row's claim key
    (`claim_key`: its lap, then TaskKind.claim_key's values), from which the queue object keeps its claim
    cursor. `after`: the claim starts after $1.after, a claim key, by a row comparison the claim index seeks
    to, and only when the rows after it run short goes on from the index's head up to it (the second lap).
    Each claimable row is in exactly one lap, so the claim takes as many rows as a claim from the head would;
    only their order differs: rows that came before the cursor since (a retry, a higher priority) wait for the
    next claim from the head, at most claim_rescan_s later."""
    where = kind.claimable_sql("t")
    if override_retry_limit:
        where = f"({kind.ready_sql}) AND t.{kind.status} IN ('pending', 'failed')"
    if only_ids:
        where += " AND t.id = ANY(ARRAY(SELECT jsonb_array_elements_text($1->'only'))::uuid[])"
    keyed = not (only_ids or override_retry_limit)
    key = kind.claim_key("t")
    columns = "t.id" + "".join(f", {column} AS k{i}" for i, column in enumerate(key[:-1])) if keyed else "t.id"

    def pick(condition: str = "", lap: int = 1) -> str:
        return f"""SELECT {columns}{f", {lap} AS lap" if keyed else ""} FROM {kind.table} t
            WHERE {where}{condition}
            ORDER BY {kind.claim_order_sql("t")}
            LIMIT ($1->>'limit')::int
            FOR UPDATE OF t SKIP LOCKED"""

    picked = pick()
    if after and keyed:
        types = kind.claim_key_types()
        cursor = ", ".join(f"($1->'after'->>{i})::{sql_type}" for i, sql_type in enumerate(types))
        past = f"({', '.join(key)}) > ({cursor})"
        # a locking clause may not stand in a UNION's own arms, but may in a subquery there
        picked = f"""SELECT * FROM ({pick(f" AND {past}")}) first_lap
            UNION ALL
            SELECT * FROM ({pick(f" AND ({past}) IS NOT TRUE", lap=2)}) second_lap
            LIMIT ($1->>'limit')::int"""
    returning = kind.returning_sql("t")
    if keyed:
        values = ", ".join(f"p.k{i}" for i in range(len(key) - 1))
        returning += f""",
            (SELECT jsonb_build_array(p.lap, {values}, p.id) FROM picked p WHERE p.id = t.id) AS claim_key"""
    return f"""
        WITH picked AS (
            {picked}
        )
        UPDATE {kind.table} t
        SET {kind.status} = 'processing', {kind.col("worker_id")} = $1->>'worker',
            {kind.col("started_at")} = now(), {kind.col("last_heartbeat")} = now(), updated_at = now()
        WHERE t.id = ANY(ARRAY(SELECT id FROM picked))  -- probe the primary key, never a hash join over the table
        RETURNING {returning}, EXTRACT(EPOCH FROM now() - t.created_at)::float8 AS queue_wait_s"""


class ClaimCursors:
    """A queue object's claim cursor per kind name (its process's, as a worker holds one queue object)."""

    def __init__(self) -> None:
        self._of_kind: dict[str, ClaimCursor] = {}

    def statement(
        self,
        kind: TaskKind,
        worker_id: str,
        limit: int,
        only_ids: Sequence[str] | None,
        override_retry_limit: bool,
        rescan_s: float,
        from_head: bool = False,
    ) -> ClaimStatement | None:
        """The next claim of `kind` (None: nothing to claim): of the given ids, or past the retry limit, without
        the cursor; else after the cursor, or from the head when there is none, it is `rescan_s` old, or
        `from_head`."""
        if limit <= 0 or (only_ids is not None and not only_ids):
            return None
        args: dict[str, Any] = {"worker": worker_id, "limit": limit}
        if only_ids is not None or override_retry_limit:
            sql = claim_sql(kind, only_ids=only_ids is not None, override_retry_limit=override_retry_limit)
            if only_ids is not None:
                args["only"] = [str(i) for i in only_ids]
            return ClaimStatement(sql, args)
        now = time.monotonic()
        cursor = self._of_kind.get(kind.name)
        if from_head or cursor is None or now - cursor.full_at >= rescan_s:
            return ClaimStatement(claim_sql(kind), args, full_at=now)
        return ClaimStatement(claim_sql(kind, after=True), {**args, "after": cursor.after}, after=True)

    def claimed(self, kind: TaskKind, statement: ClaimStatement, rows: list[dict]) -> list[dict]:
        """The rows a claim returned, without their claim keys; the cursor moves to the last of them in the claim's
        order (the second lap's last, when it went round). A claim from the head that found nothing drops it."""
        keys = [row.pop("claim_key") for row in rows if "claim_key" in row]
        if statement.full_at is None and not statement.after:
            return rows
        full_at = statement.full_at
        cursors = self._of_kind
        if not keys:
            if full_at is not None:
                cursors.pop(kind.name, None)
            return rows
        last = _last_claimed(kind, keys)
        cursor = cursors.get(kind.name)
        if full_at is not None or cursor is None:
            cursors[kind.name] = ClaimCursor(last[1:], full_at if full_at is not None else time.monotonic())
        else:
            cursor.after = last[1:]
        return rows

    def drop(self, kind: TaskKind) -> None:
        """Forget the cursor of `kind`: the next claim starts at the head."""
        self._of_kind.pop(kind.name, None)


def _last_claimed(kind: TaskKind, keys: list[list]) -> list:
    """The claim key (lap, then TaskKind.claim_key's values, as JSON) that comes last in the claim's order, ordered
    as the claim index orders them: NULLs last, times by value, ids as their text (lowercase hex, in byte order)."""
    times = [i + 1 for i, sql_type in enumerate(kind.claim_key_types()) if sql_type == "timestamptz"]
    nulls = any(None in key for key in keys)

    def order(key: list) -> tuple:
        values = list(key)
        for i in times:
            if values[i] is not None:
                values[i] = datetime.datetime.fromisoformat(values[i])
        return (values[0], *((value is None, value) for value in values[1:])) if nulls else tuple(values)

    return max(keys, key=order)
