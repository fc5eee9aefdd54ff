"""One Qdrant Edge shard as the embedded store (resources/qdrant_edge.py) keeps it: its config (how a segment is
indexed and stored), how it is opened under the folder lock, how a point and a filter look to it, and its pages.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import qdrant_edge as qe

from resources.folder_lock import QdrantStorageBusy, open_waiting_for_outsiders
from resources.page_cache import reading
from resources.ports import VectorStoreDamaged, VectorStoreError
from resources.qdrant_base import SPARSE_VECTOR, PreparedPoint, dense_of, sparse_of
from resources.vector_payload import INDEXED_PAYLOAD, PointFilter

_WAL_BUSY = "WouldBlock"
LOCAL_MODE_MARKER = "meta.json"  # what qdrant-client's local mode leaves in a folder, before the migration


def local_mode_files(path: Path) -> bool:
    """True when `path` still holds a qdrant-client local-mode storage that needs migrating."""
    return (path / LOCAL_MODE_MARKER).is_file()


def shard_exists(folder: Path) -> bool:
    return (folder / "edge_config.json").is_file()


def persisted_config(folder: Path) -> dict:
    """The shard's edge_config.json, as the engine last wrote it."""
    try:
        config = json.loads((folder / "edge_config.json").read_text())
    except (ValueError, UnicodeDecodeError) as exc:  # cut short or overwritten: the file exists (shard_exists)
        raise VectorStoreDamaged(folder, f"edge_config.json: {exc}") from None
    if not isinstance(config, dict):
        raise VectorStoreDamaged(folder, "edge_config.json holds no settings")
    return config


def engine_detail(exc: BaseException) -> str:
    """The engine's own reason, without the chain of contexts it prefixes (each repeating the folder)."""
    line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return line.rsplit("error: ", 1)[-1].strip() or line


def engine_failure(exc: BaseException) -> bool:
    """An error of the engine itself: the bindings raise plain Exception with its message."""
    return type(exc) is Exception


def _current_config(folder: Path, config: qe.EdgeConfig, dim: int, segment_points: int) -> qe.EdgeConfig | None:
    """`config` for a shard of today's shape whose index settings are older (the next optimize() rebuilds its
    segments with them); None for a shard of another shape, which _check_shape or upgrade_shape deal with."""
    persisted = persisted_config(folder)
    dense = (persisted.get("vectors") or {}).get("") or {}
    if (
        dense.get("size") != dim
        or dense.get("distance") != "Cosine"
        or SPARSE_VECTOR not in (persisted.get("sparse_vectors") or {})
    ):
        return None
    current = {"hnsw_config": HNSW_CONFIG, "quantization_config": QUANTIZATION_CONFIG}
    if (
        all(persisted.get(key) == value for key, value in current.items())
        and persisted["sparse_vectors"][SPARSE_VECTOR] == SPARSE_CONFIG
        and (persisted.get("optimizers") or {}).get("max_segment_size") == max_segment_kb(dim, segment_points)
    ):
        return None  # nothing to change: the config on disk is left as it is
    return config


def reading_quantized(folder: Path):
    """Start reading the segments' quantized vectors into the page cache (resources/page_cache.py): a shard opened
    with them on disk otherwise reads them piecemeal in its first searches, which made those searches the slowest by
    far at a million points. 384 bytes a point, never held by this process; read beside the shard's loading, which
    the caller joins the reading after."""
    return reading(folder.glob("segments/*/vector_storage/quantized.data"))


def open_shard(config: qe.EdgeConfig, dim: int, segment_points: int, read_through: bool = False):
    def opener(folder: Path, deadline: float, timeout_s: float):
        def open_once():
            if shard_exists(folder):
                current = _current_config(folder, config, dim, segment_points)
                read = reading_quantized(folder) if read_through else None
                try:
                    shard = qe.EdgeShard.load(str(folder), current)
                except Exception as exc:
                    # a shard that exists but cannot be loaded has lost or cut files; a second holder is not that
                    if not engine_failure(exc) or _WAL_BUSY in str(exc):
                        raise
                    raise VectorStoreDamaged(folder, engine_detail(exc)) from None
                finally:
                    if read is not None:
                        read.join()
            else:
                shard = qe.EdgeShard.create(str(folder), config)
            # a shard created before tenants lacks the tenant_id index: it is built once, on the first opening
            payload_indexes(shard, rebuild_in_memory=False)
            return shard

        try:
            return open_waiting_for_outsiders(open_once, lambda exc: _WAL_BUSY in str(exc), folder, deadline, timeout_s)
        except (QdrantStorageBusy, VectorStoreDamaged):
            raise
        except Exception as exc:  # noqa: BLE001  (the bindings raise plain Exception with the engine's message)
            raise VectorStoreError(
                f"cannot open the Qdrant Edge shard {folder}: "
                f"{(str(exc).strip().splitlines() or [type(exc).__name__])[0]}"
            ) from None

    return opener


def payload_indexes(shard, rebuild_in_memory: bool) -> int:
    """Build the keyword indexes of INDEXED_PAYLOAD that `shard` lacks, mapped from disk; with
    `rebuild_in_memory`, also build again those held in memory (made before they were mapped). Returns how many
    were built.

    Mapped, an opening reads nothing of them; held in memory, every opening reads them whole into hash maps, which
    was most of an opening's time (0.20-0.43 s against 0.08-0.10 s for a shard of 150,000 points), and it grows
    with the points while a mapped index does not. Building one again takes about 1 s per 100,000 points, so it
    is the index build's work (optimize()), never an opening's."""
    indexed = shard.info().payload_schema
    built = 0
    for field_name in INDEXED_PAYLOAD:
        info = indexed.get(field_name)
        if info is not None and (not rebuild_in_memory or getattr(info.params, "on_disk", None)):
            continue
        if info is not None:  # a crash right after this leaves the index missing, which the next opening builds
            shard.update(qe.UpdateOperation.delete_field_index(field_name))
        shard.update(qe.UpdateOperation.create_field_index(field_name, qe.KeywordIndexParams(on_disk=True)))
        built += 1
    return built


def edge_filter(keep: PointFilter | None) -> qe.Filter | None:
    """resources/vector_payload.PointFilter in Qdrant Edge's terms."""
    if keep is None:
        return None
    must: list = (
        [qe.FieldCondition(key="document_id", match=qe.MatchValue(keep.document_id))]
        if keep.document_id is not None
        else []
    )
    if keep.tenant is not None:
        same_tenant = qe.FieldCondition(key="tenant_id", match=qe.MatchValue(keep.tenant))
        must.append(
            qe.Filter(should=[same_tenant, qe.IsEmptyCondition("tenant_id")])
            if keep.untagged_are_tenants
            else same_tenant
        )
    must_not = (
        [qe.FieldCondition(key="document_id", match=qe.MatchAny(list(keep.exclude_document_ids)))]
        if keep.exclude_document_ids
        else None
    )
    return qe.Filter(must=must or None, must_not=must_not) if (must or must_not) else None


# How optimize() indexes a segment. Int8 scalar quantization with a graph of m=16 built with ef_construct=64 builds
# about 5x faster than Qdrant's float default (m=16, ef_construct=100) and searches about 4x faster at the same recall
# once a search visits DOCQUEUE_QDRANT_HNSW_EF candidates and rescores them on the original vectors.
# What an opening reads decides what every writer pays, since a run opens the shard once: the graph is read and
# cached (about 0.07 s a 100,000-point segment), the quantized copy and the original vectors stay on disk and are
# read as searches touch them. A cached quantized copy costs 0.6 s a segment at every opening (2.4 s against 0.25 s
# for 400,000 points on this machine) and saves a fresh opening's first few searches (p50 2.5 ms against 0.8 ms).
# The keywords' inverted index (the sparse side of hybrid search) stays on disk too: held in memory, an opening reads
# each segment's index whole (its size grows with the points), and a search reads only the posting lists of its
# query's words.
HNSW = {"m": 16, "ef_construct": 64, "full_scan_threshold": 10_000}
QUANTILE = 0.99
OVERSAMPLING = 2.0
GRAPH_MEMORY, QUANTIZED_MEMORY, VECTOR_MEMORY, SPARSE_MEMORY = "cached", "cold", "cold", "cold"
_MEMORY = {"cached": qe.Memory.Cached, "cold": qe.Memory.Cold}
# the same settings as edge_config.json records them (what an opening compares to decide whether to re-index)
HNSW_CONFIG = {**HNSW, "max_indexing_threads": 0, "memory": GRAPH_MEMORY}
QUANTIZATION_CONFIG = {"scalar": {"type": "int8", "quantile": QUANTILE, "memory": QUANTIZED_MEMORY}}
SPARSE_CONFIG = {"memory": SPARSE_MEMORY, "modifier": "idf"}


def max_segment_kb(dim: int, segment_points: int) -> int:
    """`segment_points` (DOCQUEUE_QDRANT_SEGMENT_POINTS) as Qdrant measures a segment: kilobytes of float32
    vectors."""
    return segment_points * dim * 4 // 1024


def edge_config(dim: int, segment_points: int) -> qe.EdgeConfig:
    return qe.EdgeConfig(
        vectors=qe.EdgeVectorParams(size=dim, distance=qe.Distance.Cosine, memory=_MEMORY[VECTOR_MEMORY]),
        sparse_vectors={
            SPARSE_VECTOR: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf, memory=_MEMORY[SPARSE_MEMORY])
        },
        hnsw_config=qe.HnswIndexConfig(**HNSW, memory=_MEMORY[GRAPH_MEMORY]),
        quantization_config=qe.ScalarQuantizationConfig(
            qe.ScalarType.Int8, quantile=QUANTILE, memory=_MEMORY[QUANTIZED_MEMORY]
        ),
        optimizers=qe.EdgeOptimizersConfig(max_segment_size=max_segment_kb(dim, segment_points)),
    )


def dense_search_params(hnsw_ef: int) -> qe.SearchParams:
    return qe.SearchParams(
        hnsw_ef=hnsw_ef, quantization=qe.QuantizationSearchParams(rescore=True, oversampling=OVERSAMPLING)
    )


def edge_point(point: PreparedPoint, sparse: bool) -> qe.Point:
    if not sparse:
        return qe.Point(point.id, point.vector, point.payload)
    indices, values = sparse_of(point)
    vectors: dict = {"": point.vector}
    if indices:  # a text without words gets no sparse vector
        vectors[SPARSE_VECTOR] = qe.SparseVector(indices, values)
    return qe.Point(point.id, vectors, point.payload)


def pages(shard, condition, page_size: int, with_payload, with_vector: bool = False):
    """A shard's points, page by page, in id order."""
    offset = None
    while True:
        records, offset = shard.scroll(
            qe.ScrollRequest(
                offset=offset, limit=page_size, filter=condition, with_payload=with_payload, with_vector=with_vector
            )
        )
        if records:
            yield records
        if offset is None:
            return


def write_points(shard, points: list[PreparedPoint], sparse: bool, batch: int) -> None:
    for start in range(0, len(points), batch):
        shard.update(qe.UpdateOperation.upsert_points([edge_point(p, sparse) for p in points[start : start + batch]]))


def copy_with_both_vectors(shard, spare: Path, dim: int, segment_points: int, page_size: int, batch: int) -> int:
    """Copy an older shard's points into a new shard at `spare` with the dense and the sparse vector and the
    payload indexes; returns how many were copied."""
    shutil.rmtree(spare, ignore_errors=True)
    target = qe.EdgeShard.create(str(spare), edge_config(dim, segment_points))
    try:
        payload_indexes(target, rebuild_in_memory=False)
        copied = 0
        for records in pages(shard, None, page_size, True, with_vector=True):
            points = [PreparedPoint(str(r.id), dense_of(r.vector), dict(r.payload or {})) for r in records]
            write_points(target, points, True, batch)
            copied += len(points)
    finally:
        target.close()
    return copied


def retire_folder(folder: Path, replacement: Path | None = None) -> None:
    """Drop a shard's folder (its handle closed, its lock still held), putting `replacement` in its place: renamed
    aside first, so that a crash in between leaves a whole folder, the old or the new one, never half of one."""
    retired = folder.with_name(folder.name + ".retired")
    shutil.rmtree(retired, ignore_errors=True)
    folder.rename(retired)
    if replacement is not None:
        replacement.rename(folder)
    shutil.rmtree(retired, ignore_errors=True)
