"""The hierarchical task queue as one object, `TaskQueue`: its transitions (queue_db.transitions), its
administration (queue_db.administration) and its lookups (queue_db.lookups). Plain SQL on SQLAlchemy connections;
no orchestration concepts here.

Concurrency design, in one place:
- claims use `FOR UPDATE OF t SKIP LOCKED` over the kind's claim index, so workers never wait on each other's
  candidate rows; a queue object's claims start after the last task it claimed (its claim cursor, seeking the
  index) and from the index's head at most `claim_rescan_s` apart, so a snapshot held open elsewhere, which keeps
  the entries of every task claimed since, does not make each claim walk them;
- every transition that touches task rows locks them in id order first, then their parent pages in id order,
  then their documents in id order. One global order (chunks -> pages -> documents, by id) means no deadlocks;
- a parent is recomputed by a statement that runs AFTER the parent row lock is held. Under READ COMMITTED that
  statement sees every child change committed by whoever held the lock before, so the last transaction to touch
  a parent always leaves it equal to the rule applied to its children (no lost bubble-up under concurrency);
- completions and failures are fenced: they apply only to rows still `processing` by the same worker id.
"""

from __future__ import annotations

from .administration import Administration, Correction
from .keys import document_key_for
from .lookups import Lookups
from .phases import NEVER
from .text import MAX_ERROR_CHARS, clean_text, source_path_text
from .transactions import create_queue_engine
from .transitions import Settlement, Transition, make_worker_id

__all__ = [
    "MAX_ERROR_CHARS",
    "NEVER",
    "Correction",
    "Settlement",
    "TaskQueue",
    "Transition",
    "clean_text",
    "create_queue_engine",
    "document_key_for",
    "make_worker_id",
    "source_path_text",
]


class TaskQueue(Administration, Lookups):
    """Register, claim, heartbeat, settle, recover, retry, reconcile and look up tasks of every kind."""
