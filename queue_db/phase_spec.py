"""How a phase of the pipeline is specified: its definition (`PhaseSpec`), its task kinds (`TaskKind`) with every
per-kind fact, and the registry of phases a queue serves (`PhaseRegistry`).

A phase owns its task kinds, the columns its status and roll-ups live in (on documents and, below the document,
on pages), its retry policy per kind, the Dagster pool and Celery queue its work runs in and the name of the
handler the orchestration layer maps to code. `PhaseRegistry` holds the phases in pipeline order; `PHASES`
(queue_db.phases) is the default one (OCR, vector index, GraphRAG). The queue's claim, gate, bubble-up and
stale-release SQL, and the phase's own columns and indexes, are generated from these specs (queue_db.rollup_sql),
so a phase is added by adding its spec.

A kind names its table and the columns of its phase; `claimable_sql` is the claim rule (seed: failed with
retries left first, then pending; fewest retries; oldest; plus docqueue's priority first and a back-off time),
`ready_sql` is the dependency gate (seed "Sequential Dependencies"), and `owns_sql` says whether the row's status
is still the task's own: a document's OCR status and a page's vector status become their children's roll-up once
the document is expanded or the page chunked, and from then on no worker holds them. Every per-kind query (claim,
release, stuck, waiting, held, statistics, retry, requeue, delete) is built from these predicates over the
registry's kinds, so a kind added to a phase reaches all of them. The claim indexes carry exactly the claim
predicates (`index_gate_sql`) so every claim reads an index in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Iterator, Mapping

from queue_db.retry_policy import RetryPolicy


class Level(str, Enum):
    DOCUMENT = "document"
    PAGE = "page"
    CHUNK = "chunk"


@dataclass(frozen=True, eq=False)  # kinds are singletons: identity equality, hashable
class TaskKind:
    name: str
    level: Level
    table: str
    prefix: str  # column prefix of this phase on this table
    ready_sql: str  # the dependency gate, over alias t; "TRUE" when none
    label: str  # the kind's name in statistics and read models
    returning: tuple[str, ...]
    # over alias t: the status is the task's own, not yet its children's roll-up
    owns_sql: str = "TRUE"
    # over alias t: when the task became ready (its dependency's completion), where queue wait starts
    ready_since_sql: str = "t.created_at"
    # the kind whose task on the same row must complete first (None: the dependency is elsewhere, or none)
    depends_on: "TaskKind | None" = None
    # columns a completion may set, with their SQL types
    result_columns: dict = field(default_factory=dict)
    # documents use their own names for the expansion task's bookkeeping
    column_overrides: dict = field(default_factory=dict)
    # the claim index's gate: the ready rule where it fits an index predicate ("TRUE" when it reads another table)
    index_gate_sql: str | None = None
    # the claim index's name (None: idx_<table>_<prefix>_claim)
    claim_index: str | None = None
    # this kind's own retry policy (None: the registry's default, built from the queue's settings)
    retry: RetryPolicy | None = None
    # set by the PhaseSpec that owns the kind
    phase: "PhaseSpec" = field(default=None, compare=False)  # type: ignore[assignment]

    def col(self, what: str) -> str:
        """Column for `what` in (status, worker_id, started_at, completed_at, error, error_class, retry_count,
        last_heartbeat, next_attempt_at)."""
        if what in self.column_overrides:
            return self.column_overrides[what]
        return f"{self.prefix}_{what}"

    @property
    def status(self) -> str:
        return self.col("status")

    @property
    def document_column(self) -> str:
        """The column naming the row's document."""
        return "id" if self.level is Level.DOCUMENT else "document_id"

    def max_retries_sql(self, alias: str = "t") -> str:
        """The failed attempts a task of this kind may have: its own policy's, else its row's max_retries."""
        return str(int(self.retry.attempts)) if self.retry is not None else f"{alias}.max_retries"

    def owns(self, alias: str = "t") -> str:
        return _aliased(self.owns_sql, alias)

    def held_sql(self, alias: str = "t") -> str:
        """Rows a worker holds right now: processing, and the status still the task's own."""
        return f"{alias}.{self.status} = 'processing' AND ({self.owns(alias)})"

    def backing_off_sql(self, alias: str = "t") -> str:
        """Failed rows that will be claimable once their back-off ends (not those failed for good)."""
        attempt = f"{alias}.{self.col('next_attempt_at')}"
        return (
            f"{alias}.{self.status} = 'failed' AND ({self.owns(alias)}) "
            f"AND {alias}.{self.col('retry_count')} < {self.max_retries_sql(alias)} "
            f"AND {attempt} > now() AND {attempt} < '{NEVER}'::timestamptz"
        )

    def failed_for_good_sql(self, alias: str = "t") -> str:
        """Failed rows no automatic retry will take again: out of retries, or failed as not retryable."""
        return (
            f"{alias}.{self.status} = 'failed' AND ({self.owns(alias)}) "
            f"AND ({alias}.{self.col('retry_count')} >= {self.max_retries_sql(alias)} "
            f"OR {alias}.{self.col('next_attempt_at')} >= '{NEVER}'::timestamptz)"
        )

    def blocked_sql(self, alias: str = "t") -> str:
        """Pending rows that can never become ready: the task they wait for failed for good."""
        if self.depends_on is None:
            return "FALSE"
        return (
            f"{alias}.{self.status} = 'pending' AND ({self.owns(alias)}) "
            f"AND ({self.depends_on.failed_for_good_sql(alias)})"
        )

    def work_left_sql(self, alias: str = "t") -> str:
        """Rows of this kind that still run without a person acting: ready now, held, or retried after back-off."""
        return f"(({self.claimable_sql(alias)}) OR ({self.held_sql(alias)}) OR ({self.backing_off_sql(alias)}))"

    def claim_gate_sql(self, alias: str = "t") -> str:
        """The gate the claim index's predicate holds: the ready rule where it fits an index ("TRUE" when it reads
        another table)."""
        return _aliased(self.index_gate_sql if self.index_gate_sql is not None else self.ready_sql, alias)

    def claimable_sql(self, alias: str = "t") -> str:
        """Rows this kind may claim now. Textually mirrors the partial claim index predicate."""
        status, retries = f"{alias}.{self.status}", f"{alias}.{self.col('retry_count')}"
        return (
            f"({_aliased(self.ready_sql, alias)}) "
            f"AND ({status} = 'pending' OR ({status} = 'failed' AND {retries} < {self.max_retries_sql(alias)})) "
            f"AND ({alias}.{self.col('next_attempt_at')} IS NULL OR {alias}.{self.col('next_attempt_at')} <= now())"
        )

    def returning_sql(self, alias: str = "t") -> str:
        """The claim's RETURNING list: the row's columns, and a chunk's text from its own table (migration 0012)."""
        return ", ".join(_RETURNED_ELSEWHERE.get(c, "{a}." + c).format(a=alias) for c in self.returning)

    def claim_key(self, alias: str = "t") -> tuple[str, ...]:
        """The claim order's columns, the claim index's: highest priority first (negated, so that every column
        ascends and a row comparison over them seeks the index), failed rows first, fewest retries, oldest, then
        (for a page or a chunk) its parent's id and its number under the parent, and the id, which makes the key
        unique. Rows created together (a page's chunks, a document's pages) share their created_at; after it they
        lie as they were inserted, parent by parent, so a batch claims one parent's rows together (its bubble-up
        updates few parents) and a walk over them reads the table's pages in order."""
        return tuple(f"{alias}.{c}" if c.isidentifier() else c.replace("t.", f"{alias}.") for c, _ in self._claim_key)

    def claim_key_types(self) -> tuple[str, ...]:
        """The SQL type of each claim_key column."""
        return tuple(sql_type for _, sql_type in self._claim_key)

    @property
    def _claim_key(self) -> tuple[tuple[str, str], ...]:
        within = {
            Level.DOCUMENT: (),
            Level.PAGE: (("document_id", "uuid"), ("page_number", "int")),
            Level.CHUNK: (("page_id", "uuid"), ("chunk_index", "int")),
        }[self.level]
        return (
            ("-t.priority", "int"),
            (f"CASE WHEN t.{self.status} = 'failed' THEN 0 ELSE 1 END", "int"),
            (self.col("retry_count"), "int"),
            ("created_at", "timestamptz"),
            *within,
            ("id", "uuid"),
        )

    def claim_order_sql(self, alias: str = "t") -> str:
        return ", ".join(self.claim_key(alias))

    @property
    def parent_levels(self) -> tuple[Level, ...]:
        return {Level.DOCUMENT: (), Level.PAGE: (Level.DOCUMENT,), Level.CHUNK: (Level.PAGE, Level.DOCUMENT)}[
            self.level
        ]


def _aliased(predicate: str, alias: str) -> str:
    return predicate.replace("t.", alias + ".")


# a failure that is never retried automatically waits until this finite far-future time (drivers cannot load
# 'infinity' into a datetime)
NEVER = "9999-12-31T00:00:00Z"

# returned columns that do not live on the task row
_RETURNED_ELSEWHERE = {
    "content": "(SELECT x.content FROM task_queue_chunk_text x WHERE x.chunk_task_id = {a}.id) AS content"
}

TABLE_OF_LEVEL = {Level.DOCUMENT: "documents", Level.PAGE: "task_queue_page", Level.CHUNK: "task_queue_chunk"}
# over alias t: a parent row whose status of a phase is its children's roll-up (its children exist)
EXPANDED_SQL = {Level.DOCUMENT: "t.pages_created_at IS NOT NULL", Level.PAGE: "t.chunked_at IS NOT NULL"}
_SHORT_TABLE = {"documents": "documents", "task_queue_page": "tqp", "task_queue_chunk": "tqc"}


@dataclass(frozen=True, eq=False)  # phases are singletons: identity equality, hashable
class PhaseSpec:
    """One phase of the pipeline: everything the queue and the orchestration layer need to know about it.

    `kinds` are its task kinds, outermost level first; its deepest kind's tasks are its units of work and every
    level above that one holds the phase's roll-up of its children. On documents the roll-up lives in
    `document_status_column` and `<column_prefix>_started_at/_completed_at/_error/_rollup_at/_rollup_error`; on pages in
    `<column_prefix>_status/_started_at/_completed_at/_error`. `pool` is its Dagster pool, `celery_queue` the
    Celery queue its steps run on, `handler` the name the orchestration layer maps to the code that does the work.
    """

    name: str
    kinds: tuple[TaskKind, ...]
    document_status_column: str
    pool: str
    celery_queue: str
    handler: str
    column_prefix: str = ""

    def __post_init__(self) -> None:
        if not self.column_prefix:
            object.__setattr__(self, "column_prefix", self.name)
        for kind in self.kinds:
            object.__setattr__(kind, "phase", self)

    @property
    def value(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"PhaseSpec({self.name!r})"

    @property
    def leaf(self) -> TaskKind:
        """The phase's kind at the deepest level: its tasks are the phase's units of work."""
        levels = list(Level)
        return max(self.kinds, key=lambda kind: levels.index(kind.level))

    @property
    def rollup_levels(self) -> tuple[Level, ...]:
        """The levels whose rows hold this phase's roll-up of their children, deepest first."""
        return self.leaf.parent_levels

    def rollup_column(self, level: Level, what: str) -> str:
        """The roll-up column for `what` (status, started_at, completed_at, error, rollup_at, rollup_error) on
        `level`'s table."""
        if level is Level.DOCUMENT and what == "status":
            return self.document_status_column
        return f"{self.column_prefix}_{what}"

    @property
    def previous(self) -> "PhaseSpec | None":
        """The phase before this one in the last registry built with it (PhaseRegistry.previous)."""
        return self.__dict__.get("_previous")

    def kind_at(self, level: Level) -> TaskKind | None:
        return next((kind for kind in self.kinds if kind.level is level), None)


class PhaseRegistry:
    """The phases in pipeline order, their kinds, lookups by name, and the retry policy of each kind: the kind's
    own, else `default_retry` (built from the queue's settings at the entry point)."""

    def __init__(self, phases: tuple[PhaseSpec, ...] | list[PhaseSpec], default_retry: RetryPolicy | None = None):
        self.phases: tuple[PhaseSpec, ...] = tuple(phases)
        self.default_retry = default_retry or RetryPolicy()
        names = [p.name for p in self.phases]
        kinds = [k.name for p in self.phases for k in p.kinds]
        if len(set(names)) != len(names) or len(set(kinds)) != len(kinds):
            raise ValueError(f"phase and kind names must be unique: {names}, {kinds}")
        self.kinds: tuple[TaskKind, ...] = tuple(k for p in self.phases for k in p.kinds)
        self._phases = {p.name: p for p in self.phases}
        self._kinds = {k.name: k for k in self.kinds}
        for before, phase in zip((None, *self.phases), self.phases):
            object.__setattr__(phase, "_previous", before)

    def __iter__(self) -> Iterator[PhaseSpec]:
        return iter(self.phases)

    def __len__(self) -> int:
        return len(self.phases)

    def __contains__(self, item: object) -> bool:
        return item in self.phases or item in self.kinds

    def phase(self, name: "str | PhaseSpec") -> PhaseSpec:
        if isinstance(name, PhaseSpec):
            return name
        try:
            return self._phases[name]
        except KeyError:
            raise ValueError(f"unknown phase {name!r}; phases: {', '.join(self._phases)}") from None

    def kind(self, name: "str | TaskKind") -> TaskKind:
        if isinstance(name, TaskKind):
            return name
        try:
            return self._kinds[name]
        except KeyError:
            raise ValueError(f"unknown task kind {name!r}; kinds: {', '.join(self._kinds)}") from None

    @property
    def kinds_by_name(self) -> Mapping[str, TaskKind]:
        return dict(self._kinds)

    def previous(self, phase: PhaseSpec) -> PhaseSpec | None:
        index = self.phases.index(phase)
        return self.phases[index - 1] if index else None

    def index(self, phase: PhaseSpec) -> int:
        return self.phases.index(phase)

    def kinds_of_phase(self, phase: PhaseSpec) -> tuple[TaskKind, ...]:
        return phase.kinds

    def retry_policy(self, kind: TaskKind) -> RetryPolicy:
        return kind.retry or self.default_retry

    def with_phase(self, phase: PhaseSpec) -> "PhaseRegistry":
        """This registry with `phase` appended (after the last one)."""
        return PhaseRegistry((*self.phases, phase), self.default_retry)

    def with_default_retry(self, policy: RetryPolicy) -> "PhaseRegistry":
        return PhaseRegistry(self.phases, policy)

    def level_columns(self, level: Level) -> list[tuple[str, str]]:
        """(status, completed_at) of every phase on `level`'s rows, in order: its roll-up of the children where
        it has one there, else its own task's."""
        columns = []
        for phase in self.phases:
            if level in phase.rollup_levels:
                columns.append((phase.rollup_column(level, "status"), phase.rollup_column(level, "completed_at")))
            elif (kind := phase.kind_at(level)) is not None:
                columns.append((kind.status, kind.col("completed_at")))
        return columns

    def tables(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(k.table for k in self.kinds))

    def blocked_phase_sql(self, phase: PhaseSpec, alias: str = "d") -> str:
        """Over a documents row: its `phase` is pending and nothing of this phase or an earlier one can still run
        for it, so it waits on a task that failed for good (a derived view; the stored status stays `pending`)."""
        upto = self.index(phase)
        work = " OR ".join(
            f"EXISTS (SELECT 1 FROM {k.table} w WHERE w.{k.document_column} = {alias}.id AND {k.work_left_sql('w')})"
            for k in self.kinds
            if self.index(k.phase) <= upto
        )
        return f"({alias}.{phase.document_status_column} = 'pending' AND NOT ({work}))"


def claim_index_name(kind: TaskKind) -> str:
    return kind.claim_index or f"idx_{_SHORT_TABLE.get(kind.table, kind.table)}_{kind.prefix}_claim"


def short_table(table: str) -> str:
    return _SHORT_TABLE.get(table, table)
