"""The embedded vector store: Qdrant Edge, Qdrant's own engine running in this process.

One shard per collection in `<DOCQUEUE_QDRANT_PATH>/edge/<collection>/` (WAL, segments, HNSW and a
keyword indexes on document_id and tenant_id). Opening a shard maps its segments instead of reading every point
into Python, and indexed segments are searched through HNSW; only one process may hold a shard
(a second one fails with `Can't init WAL: WouldBlock`), so an operation takes the shard's lock
file and opens it, and the shard stays open for DOCQUEUE_QDRANT_LINGER seconds (2) of idleness
after it: a run's embedding batches share one opening, and a process that waits for the lock
asks the holder to let go, which it does within 50 ms or after its current operation.

Writes land in a second, small shard, the tail (`<collection>.tail/`, with a lock of its own), never in the main
shard: opening a shard reads its segments' graphs and id trackers, so a writer that opened the main shard would pay
for the whole corpus once per run (8 s at a million points here), while the tail holds only the points written since
the last index build. Reads and deletes take the tail, then the main shard (always in that order), and see both: a
search asks each for its best hits and keeps the best of the two (a point in both counts once, the tail's copy
wins). Building the index (`optimize()`, a recovery run once DOCQUEUE_QDRANT_INDEX_TAIL points wait in the
tail, `index_tail`, and the nightly job whatever is left; see orchestration/maintenance.py) copies the tail into the
main shard, drops the tail, and builds the main shard's HNSW index without holding the tail, so runs go on writing
meanwhile. Writers count the points they add in `<collection>.unindexed` (no opening needed to read it). Segments
stop growing at DOCQUEUE_QDRANT_SEGMENT_POINTS, so one build never takes more than that many points' time and
memory, whatever the corpus holds.

Every shard made now has the sparse vector `text` (with Qdrant's IDF modifier) beside the unnamed
dense one; a shard cannot gain a vector once made, so `upgrade_shape()` copies an older shard's
points into a new one with both vectors, a page at a time, and swaps the folders.

A folder still holding qdrant-client's local-mode files (`meta.json`) is refused with one sentence
until `docqueue db upgrade` has migrated it (resources/qdrant_migrate.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import qdrant_edge as qe

from queue_db.config import default
from queue_db.service_config import VectorStoreConfig
from resources.disk_space import no_space
from resources.folder_lock import local_folder
from resources.folder_room import allocated_bytes, ensure_room, room_for_write
from resources.ports import SearchHits, VectorStoreDamaged, VectorStoreError, VectorStoreSettings
from resources.qdrant_base import (
    HYBRID_CANDIDATES,
    LOCK_TIMEOUT_S,
    SPARSE_VECTOR,
    UPSERT_BATCH,
    PreparedPoint,
    QdrantStore,
    dense_of,
)
from resources.qdrant_edge_search import Owners, retrieve_first, search_shards
from resources.qdrant_edge_shard import (
    copy_with_both_vectors,
    edge_config,
    edge_filter,
    engine_detail,
    engine_failure,
    local_mode_files,
    open_shard,
    pages,
    payload_indexes,
    persisted_config,
    reading_quantized,
    retire_folder,
    shard_exists,
    write_points,
)
from resources.vector_payload import document_filter, point_id

LINGER_S = default(VectorStoreConfig, "linger_s")
SEGMENT_POINTS = default(VectorStoreConfig, "segment_points")
HNSW_EF = default(VectorStoreConfig, "hnsw_ef")
EDGE_FOLDER = "edge"
TAIL_SUFFIX = ".tail"


class EdgeVectorStore(QdrantStore):
    is_embedded = True

    def __init__(
        self,
        *,
        path: str | Path,
        model_id: str,
        dim: int,
        lock_timeout_s: float = LOCK_TIMEOUT_S,
        upsert_batch: int = UPSERT_BATCH,
        hybrid_candidates: int = HYBRID_CANDIDATES,
        linger_s: float = LINGER_S,
        segment_points: int = SEGMENT_POINTS,
        hnsw_ef: int = HNSW_EF,
        allow_local_mode_files: bool = False,
    ):
        super().__init__(
            model_id=model_id,
            dim=dim,
            lock_timeout_s=lock_timeout_s,
            upsert_batch=upsert_batch,
            hybrid_candidates=hybrid_candidates,
        )
        if not path:
            raise ValueError("the embedded Qdrant store needs its folder (DOCQUEUE_QDRANT_PATH)")
        self._refuse_local_mode = not allow_local_mode_files  # only the migration writes beside them
        self.root = Path(path).expanduser().resolve()
        self.location = str(self.root)
        self.folder = self.root / EDGE_FOLDER / self.collection
        self.tail_folder = self.folder.with_name(self.collection + TAIL_SUFFIX)
        self._sparse = True
        self.segment_points = segment_points
        self.hnsw_ef = hnsw_ef
        self._owners = Owners()  # the documents of points read by deep looks (resources/qdrant_edge_search.py)
        config = edge_config(dim, segment_points)
        self._gate = local_folder(
            self.folder,
            open_shard(config, dim, segment_points, read_through=True),
            lock_path=self.folder.parent / f"{self.collection}.lock",
            linger_s=linger_s,
        )
        self._tail_gate = local_folder(
            self.tail_folder,
            open_shard(config, dim, segment_points),
            lock_path=self.folder.parent / f"{self.collection}{TAIL_SUFFIX}.lock",
            linger_s=linger_s,
        )

    @classmethod
    def from_settings(cls, settings: VectorStoreSettings, model_id: str, dim: int) -> EdgeVectorStore:
        """The embedded store in `settings.path`."""
        return cls(
            path=settings.path,
            model_id=model_id,
            dim=dim,
            lock_timeout_s=settings.lock_timeout_s,
            upsert_batch=settings.upsert_batch,
            hybrid_candidates=settings.hybrid_candidates,
            linger_s=settings.linger_s,
            segment_points=settings.segment_points,
            hnsw_ef=settings.hnsw_ef,
        )

    # ----------------------------------------------------------------- connections

    @contextmanager
    def session(self) -> Iterator[EdgeVectorStore]:
        """Hold the shard writes go to (the tail) for a block of writes; reads in it open the main shard too."""
        with self._tail():
            yield self

    def _refuse_old_storage(self) -> None:
        if self._refuse_local_mode and local_mode_files(self.root):
            raise VectorStoreError(
                f"the embedded Qdrant folder {self.root} still holds the old local-mode "
                f"storage; run `docqueue db upgrade` to migrate it"
            )

    @contextmanager
    def _shard(self):
        """The main shard, made when missing."""
        self._refuse_old_storage()
        with self._gate.open(self.lock_timeout_s) as shard:
            # every time (one small file): another process may have upgraded the shard since this store last looked
            self._check_shape()
            yield shard

    @contextmanager
    def _tail(self):
        """The tail, made when missing."""
        self._refuse_old_storage()
        if shard_exists(self.folder):  # from the file alone: a writer never opens the main shard
            self._check_shape()
        with self._tail_gate.open(self.lock_timeout_s) as shard:
            self._check_shape(self.tail_folder)
            yield shard

    @contextmanager
    def _both(self):
        """(tail, main) as they exist, each None when missing: the tail's lock first, as everywhere."""
        with self._existing_tail() as tail, self._existing() as main:
            yield tail, main

    def _existing_tail(self):
        if not shard_exists(self.tail_folder):
            self._refuse_old_storage()
            return nullcontext()
        return self._tail()

    def _check_shape(self, folder: Path | None = None) -> None:
        config = persisted_config(folder or self.folder)
        vectors = config.get("vectors", {})
        if folder is None:  # the main shard's shape decides whether searches may use the sparse vector
            self._sparse = SPARSE_VECTOR in (config.get("sparse_vectors") or {})
        if set(vectors) != {""}:
            raise VectorStoreError(f"collection {self.collection} uses named vectors; docqueue expects one vector")
        size, distance = vectors[""].get("size"), vectors[""].get("distance")
        if size != self.dim or distance != "Cosine":
            raise VectorStoreError(
                f"collection {self.collection} holds {size}-d {distance} vectors; "
                f"{self.model_id} needs {self.dim}-d Cosine"
            )

    def _existing(self):
        """The open shard, or None when the collection was never written (reads stay empty, create nothing)."""
        if not shard_exists(self.folder) and not (self._refuse_local_mode and local_mode_files(self.root)):
            return nullcontext()
        return self._shard()

    def ensure_collection(self) -> None:
        if not shard_exists(self.tail_folder):
            ensure_room(self.root)
        with self._tail():
            pass

    def _writing(self, extra_bytes: int = 0):
        return room_for_write(self.root, self.close, extra_bytes)

    def close(self) -> None:
        """Let go of the shards kept open between operations (a run's end, a CLI command's end)."""
        self._tail_gate.release()
        self._gate.release()

    @contextmanager
    def _reading(self, folder: Path):
        """A read of one shard: the engine's error on a file it cannot read back names that shard as damaged."""
        try:
            yield
        except Exception as exc:
            if not engine_failure(exc) or no_space(exc):
                raise
            raise VectorStoreDamaged(folder, engine_detail(exc)) from None

    # ----------------------------------------------------------------- damage

    def shard_folders(self) -> list[Path]:
        """The shards that exist, the tail first (the order every operation takes them in)."""
        return [folder for folder in (self.tail_folder, self.folder) if shard_exists(folder)]

    def check_shard(self, folder: Path) -> str | None:
        """Why this shard (the tail's or the main one's folder) cannot be read back, or None when every point's
        payload and vectors read: it is opened and read a page at a time under its lock."""
        gate = self._tail_gate if folder == self.tail_folder else self._gate
        try:
            with gate.open(self.lock_timeout_s) as shard, self._reading(folder):
                for _ in pages(shard, None, self.scroll_page, True, with_vector=True):
                    pass
        except VectorStoreDamaged as exc:
            gate.release()
            return str(exc)
        return None

    def set_aside(self, folder: Path, stamp: str) -> Path:
        """Rename a damaged shard's folder to `<folder>.damaged-<stamp>`, under its lock, so that the next
        operation makes a fresh, empty one of today's shape; its files are kept for a person to look at."""
        gate = self._tail_gate if folder == self.tail_folder else self._gate
        kept = folder.with_name(f"{folder.name}.damaged-{stamp}")
        tail = folder == self.tail_folder
        with gate.held(self.lock_timeout_s):
            folder.rename(kept)
        if tail:
            self._set_unindexed(0)  # the points it counted went with it
        with self._tail() if tail else self._shard():  # made afresh, with its payload indexes
            pass
        return kept

    # ----------------------------------------------------------------- writes

    def write_prepared(self, points: list[PreparedPoint]) -> None:
        if not points:
            return
        with self._writing(), self._tail() as tail:
            write_points(tail, points, True, self.upsert_batch)
            # under the tail's lock, so writers never lose each other's counts
            self._set_unindexed(self.unindexed() + len(points))

    @property
    def _unindexed_file(self) -> Path:
        return self.folder.parent / f"{self.collection}.unindexed"

    def unindexed(self) -> int:
        """Points written to the tail since the last index build (retries count twice: an early build is
        harmless), read without opening a shard."""
        try:
            return int(self._unindexed_file.read_text().strip() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def _set_unindexed(self, n: int) -> None:
        spare = self._unindexed_file.with_suffix(".tmp")
        try:
            spare.write_text(str(n))
            spare.replace(self._unindexed_file)
        except OSError:
            spare.unlink(missing_ok=True)  # the count stays as it was: a build merely comes a little later
            raise

    def index_tail(self, threshold: int) -> bool:
        if threshold <= 0 or self.unindexed() < threshold:
            return False
        return self.optimize()

    def has_sparse(self) -> bool:
        with self._existing() as shard:
            return shard is None or self._sparse

    def upgrade_shape(self) -> int:
        """Copy the points of a shard without the sparse vector into `<collection>.upgrade` with both vectors, then
        swap the folders, all under the shard's lock; a copy broken off half-way is begun again."""
        spare = self.folder.with_name(self.folder.name + ".upgrade")
        with self._existing() as shard:
            if shard is None or self._sparse:
                return 0
            ensure_room(self.root, allocated_bytes(self.folder))  # the copy is as big as the shard
            copied = copy_with_both_vectors(
                shard, spare, self.dim, self.segment_points, self.scroll_page, self.upsert_batch
            )
            # the open shard goes first, so the folder can be swapped while the lock is still held
            self._gate.close_handle()
            retire_folder(self.folder, spare)
            return copied

    def delete_chunks(self, chunk_ids: Iterable[str]) -> None:
        ids = [point_id(chunk_id) for chunk_id in dict.fromkeys(chunk_ids)]
        if not ids:
            return
        with self._writing(), self._both() as shards:
            for shard in shards:
                if shard is not None:
                    for start in range(0, len(ids), self.upsert_batch):
                        shard.update(qe.UpdateOperation.delete_points(ids[start : start + self.upsert_batch]))

    def delete_document(self, document_id: str) -> None:
        with self._writing(), self._both() as shards:
            for shard in shards:
                if shard is not None:
                    shard.update(qe.UpdateOperation.delete_points_by_filter(edge_filter(document_filter(document_id))))

    # ----------------------------------------------------------------- reads

    def count(self, document_id: str | None = None) -> int:
        """Exact: a point in both shards (a chunk written again before its tail was merged) counts once."""
        condition = edge_filter(document_filter(document_id)) if document_id is not None else None
        with self._both() as (tail, main):
            stored = main.count(qe.CountRequest(exact=True, filter=condition)) if main is not None else 0
            if tail is None:
                return stored
            for records in pages(tail, condition, self.scroll_page, ["chunk_id"]):
                stored += len(records) - (
                    len(main.retrieve([r.id for r in records], False, False)) if main is not None else 0
                )
            return stored

    def chunk_ids(self, document_id: str | None = None) -> set[str]:
        found: set[str] = set()
        condition = edge_filter(document_filter(document_id)) if document_id is not None else None
        with self._both() as shards:
            for shard, folder in zip(shards, (self.tail_folder, self.folder)):
                if shard is not None:
                    with self._reading(folder):
                        for records in pages(shard, condition, self.scroll_page, ["chunk_id"]):
                            found.update(record.payload["chunk_id"] for record in records if record.payload)
        return found

    def _scroll_chunk_ids(self, offset, limit: int) -> tuple[list, object]:
        """The main shard's points, then the tail's that the main shard lacks; the offset says which shard
        ("main" or "tail") and where in it. Shards are taken per page, so runs waiting to write get their turn
        during a long verification. The vectors are read too (and dropped): verification is then a read of every
        stored byte a search needs, so a cut or missing segment file is found (VectorStoreDamaged) before a search
        meets it."""
        side, position = offset if offset is not None else ("main", None)
        with self._both() as (tail, main):
            if side == "main":
                if main is not None:
                    with self._reading(self.folder):
                        records, position = main.scroll(
                            qe.ScrollRequest(offset=position, limit=limit, with_payload=["chunk_id"], with_vector=True)
                        )
                    if position is not None or records:
                        return records, ("main", position) if position is not None else ("tail", None)
                side, position = "tail", None
            if tail is None:
                return [], None
            with self._reading(self.tail_folder):
                records, position = tail.scroll(
                    qe.ScrollRequest(offset=position, limit=limit, with_payload=["chunk_id"], with_vector=True)
                )
            if main is not None and records:
                with self._reading(self.folder):
                    merged = {str(r.id) for r in main.retrieve([r.id for r in records], False, False)}
                records = [r for r in records if str(r.id) not in merged]
            return records, ("tail", position) if position is not None else None

    def _listed(self, tail, main) -> list[tuple]:
        """The open shards with their folders, the tail first (the newer copy of a point wins)."""
        return [
            (shard, folder) for shard, folder in ((tail, self.tail_folder), (main, self.folder)) if shard is not None
        ]

    def _retrieve(self, ids: list[str], with_payload, with_vectors: bool) -> list:
        with self._both() as (tail, main):
            shards = self._listed(tail, main)
            return retrieve_first(shards, ids, self._reading, with_payload, with_vectors)

    def _search(self, request, keep) -> SearchHits:
        with self._both() as (tail, main):
            if tail is None and main is None:
                return SearchHits(mode=request.mode)
            notice = None
            if not self._sparse:
                request, notice = self._dense_only(request)
            shards = self._listed(tail, main)
            hits = search_shards(shards, request, edge_filter(keep), self.hnsw_ef, self._reading, self._owners)
        return SearchHits(hits, mode=request.mode, notice=notice)

    def merge_tail(self) -> int:
        """Copy the tail's points into the main shard (an upsert: a point already there is replaced), then drop the
        tail, holding both shards; returns the points copied. Broken off half-way, it is begun again: the copy
        repeats harmlessly and reads see each point once meanwhile."""
        with self._existing_tail() as tail:
            if tail is None:
                self._set_unindexed(0)
                return 0
            copied = 0
            # the main shard takes a copy of every point of the tail
            with self._writing(allocated_bytes(self.tail_folder)), self._shard() as main:
                for records in pages(tail, None, self.upsert_batch, True, with_vector=True):
                    # the stored vectors as they are (a main shard of the older shape takes the dense one alone)
                    main.update(
                        qe.UpdateOperation.upsert_points(
                            [
                                qe.Point(r.id, r.vector if self._sparse else dense_of(r.vector), r.payload)
                                for r in records
                            ]
                        )
                    )
                    copied += len(records)
            # the open tail goes first, so its folder can be dropped while its lock is still held
            self._tail_gate.close_handle()
            retire_folder(self.tail_folder)
            self._set_unindexed(0)
            return copied

    def prepare_reads(self) -> None:
        """Open both shards as a search would; they stay open for the store's linger. The main shard's quantized
        vectors, which its opening reads through, start reading before the tail opens, so that read from disk (after
        a closing emptied the page cache of them) it runs beside both openings rather than the main shard's alone."""
        reading = reading_quantized(self.folder) if shard_exists(self.folder) else None
        try:
            with self._both():
                pass
        finally:
            if reading is not None:
                reading.join()

    def optimize(self) -> bool:
        """Merge the tail into the main shard, then its segments and build their HNSW indexes, holding the main
        shard until done but the tail only for the copy (the nightly job, and a recovery run once
        DOCQUEUE_QDRANT_INDEX_TAIL points wait)."""
        self.merge_tail()
        with self._existing() as shard:
            if shard is None:
                return False
            rebuilt = payload_indexes(shard, rebuild_in_memory=True)
            return bool(shard.optimize()) or rebuilt > 0

    def info(self) -> dict:
        with self._both() as (tail, main):
            if tail is None and main is None:
                return {"points": 0, "segments": 0, "indexed_vectors": 0}
            tail_info, main_info = (shard.info() if shard is not None else None for shard in (tail, main))
            parts = [part for part in (tail_info, main_info) if part is not None]
            return {
                "points": self.count(),
                "segments": sum(part.segments_count for part in parts),
                "indexed_vectors": main_info.indexed_vectors_count if main_info is not None else 0,
            }
