"""Embedding identical chunk text once (DOCQUEUE_EMBEDDING_DEDUP): chunks embedded, and the vector phase's time,
with and without deduplication, side by side in one run on the same queue state.

The documents are the text PDFs of `../shared/corpus` (MANIFEST category `text`, pages made by the real PDF
worker) plus a generated second version of each: the same pages with a few edits (one word changed on every third
page, a revision line added to the last page), registered as new documents after the first versions, as a
re-ingested revision is. Every page is chunked by processing.chunking. Two copies of one seeded queue database
(CREATE DATABASE ... TEMPLATE) are then embedded by the real vector phase (Pipeline.embed_chunks, MiniLM int8,
an embedded Qdrant Edge store each), batches of DOCQUEUE_EMBED_BATCH claimed in queue order: once with dedup off,
once with it on. The vectors of both runs are compared chunk by chunk (a copied vector must be the vector the
model gives that text). Ends with one line `RESULT {json}`.

    .venv/bin/python bench/chunk_dedup.py [--admin-url postgresql://postgres@127.0.0.1:5432/postgres]
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import psycopg  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from bench._result import print_result  # noqa: E402

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus"
EDIT_EVERY = 3  # pages: one word changed on every third page of the second version


def corpus_pages(corpus: Path) -> dict[str, list[str]]:
    """filename -> markdown of each page, for the corpus's text PDFs."""
    from resources.ocr import PdfProcessor

    with (corpus / "MANIFEST.tsv").open() as manifest:
        names = [row["filename"] for row in csv.DictReader(manifest, delimiter="\t") if row["category"] == "text"]
    pages = {}
    with PdfProcessor() as pdf:
        for name in names:
            path = corpus / name
            info = pdf.inspect(path)
            pages[name] = [
                pdf.convert_page(path, n, boilerplate=info.boilerplate).markdown for n in range(1, info.page_count + 1)
            ]
    return pages


def second_version(pages: list[str]) -> list[str]:
    """The same pages with a few edits, as a revised document has."""
    edited = []
    for number, page in enumerate(pages, start=1):
        if number % EDIT_EVERY == 0 and " the " in page:
            middle = page.find(" the ", len(page) // 2)
            at = middle if middle >= 0 else page.find(" the ")
            page = page[:at] + " this " + page[at + len(" the ") :]
        edited.append(page)
    edited[-1] = edited[-1] + "\n\nRevised in November 2026: figures checked against the final report."
    return edited


def admin(admin_url: str, statement: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(statement)


def seed(url: str, documents: dict[str, list[str]]) -> int:
    """Register, expand, "OCR" and chunk every document through the queue API; returns the number of chunks."""
    from processing.chunking import chunk_markdown
    from queue_db.keys import page_partition_key
    from queue_db.phases import OCR_DOCUMENT, OCR_PAGE, VECTOR_PAGE
    from queue_db.queue import TaskQueue, create_queue_engine, make_worker_id

    queue = TaskQueue(create_queue_engine(url))
    worker, chunks_total = make_worker_id("bench"), 0
    for name, pages in documents.items():
        doc, _ = queue.register_document(filename=name, content_hash=uuid.uuid4().hex * 2, size_bytes=1)
        queue.claim(OCR_DOCUMENT, worker, 1, only_ids=[doc["id"]])
        queue.complete_document_expansion(worker, doc["id"], page_count=len(pages))
        page_rows = queue.pages(doc["id"])
        queue.claim(OCR_PAGE, worker, len(page_rows), only_ids=[p["id"] for p in page_rows])
        queue.complete(
            OCR_PAGE, worker, [{"id": p["id"], "page_file_path": f"bench/{p['page_number']}.md"} for p in page_rows]
        )
        document_key = queue.document(str(doc["id"]))["document_key"]
        for page in queue.claim(VECTOR_PAGE, worker, len(page_rows), only_ids=[p["id"] for p in page_rows]):
            chunks = chunk_markdown(
                pages[page["page_number"] - 1], page_key=page_partition_key(document_key, page["page_number"])
            )
            queue.complete_chunking(
                worker,
                page["id"],
                [
                    {
                        "chunk_index": c.index,
                        "content_hash": c.content_hash,
                        "content": c.text,
                        "token_count": c.token_count,
                    }
                    for c in chunks
                ],
            )
            chunks_total += len(chunks)
    queue.engine.dispose()
    return chunks_total


class CountingEmbedder:
    """The real embedder, counting the texts it embeds."""

    def __init__(self, inner):
        self.inner, self.texts = inner, 0
        self.model_id, self.dim = inner.model_id, inner.dim

    def embed_covered(self, texts):
        self.texts += len(texts)
        return self.inner.embed_covered(texts)


def embed_all(url: str, store_path: Path, dedup: bool, batch: int) -> dict:
    from orchestration.pipeline import Pipeline
    from queue_db.phases import VECTOR_CHUNK
    from queue_db.queue import TaskQueue, create_queue_engine, make_worker_id
    from resources.embeddings import get_embedder
    from resources.qdrant_edge import EdgeVectorStore

    os.environ["DOCQUEUE_EMBEDDING_DEDUP"] = "true" if dedup else "false"
    embedder = CountingEmbedder(get_embedder())
    store = EdgeVectorStore(path=str(store_path), model_id=embedder.model_id, dim=embedder.dim)
    queue = TaskQueue(create_queue_engine(url))
    pipeline = Pipeline(queue, embedder=embedder, vector_store_factory=lambda model_id, dim: store)
    worker, chunks, failed = make_worker_id("bench"), 0, 0
    started = time.perf_counter()
    with store.session():
        while tasks := queue.claim(VECTOR_CHUNK, worker, batch):
            outcomes = pipeline.embed_chunks(worker, tasks)
            chunks += len(tasks)
            failed += sum(1 for o in outcomes if not o.ok)
    seconds = time.perf_counter() - started
    with queue.engine.connect() as conn:
        reused = conn.exec_driver_sql(
            "SELECT count(*) FROM task_queue_chunk WHERE vector_reused_from IS NOT NULL"
        ).scalar()
        # copies inside the first versions (repeated text in one corpus) apart from those of the second versions
        by_version = dict(
            conn.exec_driver_sql(
                """SELECT split_part(d.filename, '/', 1), count(*) FROM task_queue_chunk c
               JOIN documents d ON d.id = c.document_id WHERE c.vector_reused_from IS NOT NULL GROUP BY 1"""
            ).all()
        )
        chunk_ids = [r[0] for r in conn.exec_driver_sql("SELECT chunk_id FROM task_queue_chunk")]
    vectors = {c: np.asarray(v.vector) for c, v in store.vectors(chunk_ids).items()}
    store.close()
    queue.engine.dispose()
    return {
        "chunks": chunks,
        "embedded": embedder.texts,
        "reused": int(reused),
        "reused_in_first_versions": int(by_version.get("v1", 0)),
        "reused_in_second_versions": int(by_version.get("v2", 0)),
        "failed": failed,
        "seconds": round(seconds, 2),
        "vectors": vectors,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--admin-url",
        default=os.environ.get("DOCQUEUE_BENCH_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
    )
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    args = parser.parse_args()
    if not (args.corpus / "MANIFEST.tsv").exists():
        print(f"bench/chunk_dedup.py: no corpus at {args.corpus} (MANIFEST.tsv missing)", file=sys.stderr)
        return 2

    from queue_db.config import EmbeddingConfig, settings
    from queue_db.migrate import upgrade

    pages = corpus_pages(args.corpus)
    documents = {**{f"v1/{n}": p for n, p in pages.items()}, **{f"v2/{n}": second_version(p) for n, p in pages.items()}}
    tag = f"bench_dedup_{uuid.uuid4().hex[:8]}"
    names = {"seed": f"{tag}_seed", False: f"{tag}_off", True: f"{tag}_on"}
    url = {k: make_url(args.admin_url).set(database=v).render_as_string(hide_password=False) for k, v in names.items()}
    workdir = Path(tempfile.mkdtemp(prefix="docqueue-bench-dedup-"))
    batch = settings(EmbeddingConfig).batch_size
    results: dict = {
        "cpus": os.cpu_count(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "documents": len(documents),
        "pages": sum(len(p) for p in documents.values()),
        "batch": batch,
    }
    try:
        admin(args.admin_url, f'CREATE DATABASE "{names["seed"]}"')
        engine = create_engine_for(url["seed"])
        upgrade(engine)
        engine.dispose()  # a template takes no connections
        results["chunks"] = seed(url["seed"], documents)
        results["first_version_chunks"] = results["chunks"] - chunks_of(url["seed"], "v2/")
        results["distinct_texts"] = distinct_texts(url["seed"])
        for dedup in (False, True):
            admin(args.admin_url, f'CREATE DATABASE "{names[dedup]}" TEMPLATE "{names["seed"]}"')
        get_model_loaded()
        runs = {dedup: embed_all(url[dedup], workdir / f"qdrant-{dedup}", dedup, batch) for dedup in (False, True)}
    finally:
        for name in names.values():
            admin(args.admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        shutil.rmtree(workdir, ignore_errors=True)
    off, on = runs[False], runs[True]
    shared = set(off["vectors"]) & set(on["vectors"])
    similarity = [float(np.dot(off["vectors"][c], on["vectors"][c])) for c in shared]
    for label, run in (("dedup off", off), ("dedup on", on)):
        print(
            f"{label:9}: {run['chunks']} chunks, {run['embedded']} embedded, {run['reused']} copied, "
            f"{run['failed']} failed, {run['seconds']} s"
        )
    results.update(
        {
            "off": {k: v for k, v in off.items() if k != "vectors"},
            "on": {k: v for k, v in on.items() if k != "vectors"},
            "embedded_saving_pct": round(100 * (1 - on["embedded"] / off["embedded"]), 1),
            "time_saving_pct": round(100 * (1 - on["seconds"] / off["seconds"]), 1),
            "points": [len(off["vectors"]), len(on["vectors"])],
            "min_cosine_copied_vs_embedded": round(min(similarity), 6) if similarity else None,
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        }
    )
    print(
        f"saving: {results['embedded_saving_pct']} % of the chunks embedded, {results['time_saving_pct']} % of "
        f"the vector phase's time; every copied vector matches the model's own (min cosine "
        f"{results['min_cosine_copied_vs_embedded']})"
    )
    print_result(results)
    return 0


def create_engine_for(url: str):
    from queue_db.queue import create_queue_engine

    return create_queue_engine(url)


def chunks_of(url: str, prefix: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT count(*) FROM task_queue_chunk c JOIN documents d ON d.id = c.document_id WHERE d.filename LIKE %s",
            (prefix + "%",),
        ).fetchone()[0]


def distinct_texts(url: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT count(DISTINCT chunk_content_hash) FROM task_queue_chunk").fetchone()[0]


def get_model_loaded() -> None:
    """Load the model before either run is timed."""
    from resources.embeddings import get_embedder

    get_embedder().embed_covered(["warm up"])


if __name__ == "__main__":
    sys.exit(main())
