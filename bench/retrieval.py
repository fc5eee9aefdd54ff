"""Known-item retrieval: does `docqueue search` find the page a query was taken from?

The folders (default: ../shared/corpus, i.e. DOCQUEUE_CORPUS) go through the real pipeline — `docqueue db upgrade`,
`ingest`, `run --until-idle`, as subprocesses — into a scratch DOCQUEUE_HOME (its own embedded PostgreSQL and Bolt
server on free ports, stopped and deleted afterwards), or into the home given by --home, which is kept (and reused
as it is with --no-process). Queries are sampled, with a seeded generator, from the pages' markdown:

  sentence  a verbatim sentence of 8-40 words (tables, headings and markup left out; a sentence whose words, in
            their order, are on more than one page is not used, its page would be ambiguous: words, not characters,
            so a copy that differs only in emphasis marks, spacing or punctuation makes a sentence shared)
  keywords  the same sentence shortened to its --keywords rarest words (document frequency over all pages), in
            their order in the sentence

  shared    with --plant-copies or copies in the folders: a verbatim sentence whose words are found in more than
            one document, all of one family (an input and its copies), attributed to one of them drawn at random;
            sentences that documents of several families share (boilerplate) are counted, not asked

--plant-copies N writes, for the first N inputs with a text layer, a version with one word changed per page and a
re-scan (pages rendered at another DPI, turned a little, image-only: read by OCR) into a scratch folder and ingests
them beside the inputs (bench/_planted.py); --plant-boilerplate N adds N documents that are no copies but share
one notice page word for word (grouping them is wrong); --text-layer-only takes only inputs with a text layer.

Each query runs through the `docqueue search` command itself (in-process, `--json --limit 10`, copies collapsed
into one hit per content group as users get them), once per search mode given by --modes (hybrid, the default, and
`--dense` / `--sparse` for comparison). Per mode and query type: doc hit@1 and @5 (the query's document among the
first hits), page hit@5 (its page), MRR (reciprocal rank of the first hit from its document, 0 past rank 10), group
hit@1 (the first hit's document or one of its `also_in_keys` is the query's document). Also reported: pages and
chunks indexed, the largest chunk in tokens, and the pair precision and recall of the content groups the pipeline
formed (tables content_groups / content_group_members) against the families of original and planted copies.

  .venv/bin/python bench/retrieval.py [FOLDER ...] [--queries 100] [--seed 7] [--keywords 4]
        [--max-documents N] [--suffixes pdf] [--home DIR] [--no-process] [--workers 1]
        [--modes dense,sparse,hybrid] [--plant-copies N] [--plant-boilerplate N] [--text-layer-only]
        [--misses FILE]

--misses FILE writes each verbatim sentence whose first hit is not from its document, as JSON: the collapsed hits,
every copy's hits (`--all`) with whether the sentence is in their chunk, and the other pages whose prose holds its
words.

Ends with one line `RESULT {json}`: doc_hit_at_1, doc_hit_at_5, page_hit_at_5, mrr (verbatim sentences found in
one document only; doc_hit_at_1 again as unique_doc_hit_at_1), group_hit_at_1 and shared_queries (sentences found
in several documents), group_precision, group_recall, planted_copies, the keyword figures as
keywords_doc_hit_at_1, keywords_doc_hit_at_5, keywords_page_hit_at_5, keywords_mrr, keywords_group_hit_at_5 (a
collapsed hit counts for the documents it names as also-in), and the counts, all of the first mode given (hybrid
by default); with more than one mode, `by_mode` holds each mode's figures under the same names.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import _planted  # noqa: E402
from bench._result import print_result  # noqa: E402
from processing.words import HTML_TAG, text_words  # noqa: E402

DEFAULT_CORPUS = Path(os.environ.get("DOCQUEUE_CORPUS") or REPO.parent / "shared" / "corpus")
SEARCH_LIMIT = 10
MODES = ("hybrid", "dense", "sparse")
RANKS = (1, 5)
MIN_WORDS, MAX_WORDS = 8, 40
DEFAULT_SUFFIXES = "pdf"
STOPWORDS = frozenset(
    """
a about above after again against all also am an and any are as at be because been before being below between both
but by can could did do does doing down during each few for from further had has have having he her here hers him
his how i if in into is it its itself just me more most my no nor not now of off on once only or other our ours out
over own same she should so some such than that the their theirs them then there these they this those through to
too under until up very was we were what when where which while who whom why will with would you your yours
""".split()
)

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_WORD = re.compile(r"[^\W\d_][\w'’-]*", re.UNICODE)
# HTML tags (<br>, <sup>k</sup>: the k stays), emphasis marks, links (their text stays)
_MARKUP = re.compile(HTML_TAG.pattern + r"|[*_`#>]+|\[([^\]]*)\]\([^)]*\)")


@dataclass(frozen=True)
class Page:
    document_key: str
    page_number: int
    markdown: str


@dataclass(frozen=True)
class Query:
    kind: str
    text: str
    document_key: str
    page_number: int


# ------------------------------------------------------------------------------------------------ processing
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _docqueue(*args: str, timeout: float, failed_tasks_ok: bool = False) -> str:
    from orchestration.cli import EXIT_TASKS_FAILED

    command = [sys.executable, "-m", "orchestration.cli", *args]
    done = subprocess.run(command, cwd=REPO, env=os.environ.copy(), capture_output=True, text=True, timeout=timeout)
    if failed_tasks_ok and done.returncode == EXIT_TASKS_FAILED:
        # a corpus holds broken files on purpose (corrupt, encrypted): their tasks fail, the others are evaluated
        print(f"docqueue {' '.join(args)}: {done.stderr.strip()[-500:]}", file=sys.stderr)
    elif done.returncode != 0:
        raise SystemExit(f"docqueue {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done.stdout


def select_inputs(
    folders: list[Path], max_documents: int | None, suffixes: str = DEFAULT_SUFFIXES, text_layer_only: bool = False
) -> list[Path]:
    """The files with these suffixes directly inside the folders (sub-folders such as a corpus's ground truth and
    its README are left out), sorted by path so a limited selection is stable; with `text_layer_only`, those
    PyMuPDF finds text in."""
    wanted = {"." + suffix.strip().lower().lstrip(".") for suffix in suffixes.split(",") if suffix.strip()}
    files = sorted(
        path for folder in folders for path in folder.iterdir() if path.is_file() and path.suffix.lower() in wanted
    )
    if text_layer_only:
        files = [path for path in files if _planted.has_text_layer(path)]
    return files[:max_documents] if max_documents else files


def _read_limits():
    """The PDF reading settings (OCR languages, thresholds) of the pipeline this environment runs."""
    from queue_db.config import Settings
    from resources.pdf_limits import PdfLimits

    return PdfLimits.from_config(Settings.from_env().storage)


def process(files: list[Path], workers: int, timeout: float) -> float:
    """`docqueue db upgrade`, `ingest FILES`, `run --until-idle`; returns the seconds they took."""
    started = time.perf_counter()
    _docqueue("db", "upgrade", timeout=600)
    _docqueue("ingest", *map(str, files), "--json", timeout=600)
    _docqueue("run", "--until-idle", "--workers", str(workers), timeout=timeout, failed_tasks_ok=True)
    return time.perf_counter() - started


# ------------------------------------------------------------------------------------------------ queries
def indexed_pages() -> tuple[list[Page], dict]:
    """Pages of documents whose vectors are complete and visible to search, with their markdown; chunk figures."""
    from orchestration.cli.context import open_queue
    from processing.tokenizer import count_tokens_batch
    from queue_db.config import Settings
    from queue_db.lifecycle import hidden_from_search
    from resources.storage_resource import StorageResource

    queue = open_queue(Settings.from_env())
    hidden = set(hidden_from_search(queue))
    storage = StorageResource.from_settings(Settings.from_env()).get_storage()
    with queue.engine.connect() as conn:
        rows = conn.exec_driver_sql(
            """SELECT d.id, d.document_key, p.page_number, p.page_file_path
               FROM task_queue_page p JOIN documents d ON d.id = p.document_id
               WHERE d.vector_index_status = 'completed' AND p.page_file_path IS NOT NULL
               ORDER BY d.document_key, p.page_number"""
        ).all()
        chunks = [
            row[0]
            for row in conn.exec_driver_sql(
                """SELECT t.content FROM task_queue_chunk_text t JOIN task_queue_chunk c ON c.id = t.chunk_task_id
               WHERE c.vector_status = 'completed'"""
            ).all()
        ]
    pages = [
        Page(key, number, storage.get_text(path)) for doc_id, key, number, path in rows if str(doc_id) not in hidden
    ]
    tokens = count_tokens_batch(chunks)
    return pages, {
        "documents": len({p.document_key for p in pages}),
        "pages": len(pages),
        "chunks": len(chunks),
        "max_chunk_tokens": max(tokens, default=0),
        "chunks_over_400_tokens": sum(1 for count in tokens if count > 400),
    }


def content_groups() -> list[tuple[str, str, str | None]]:
    """(document_key, file name, content group id or None) of each document whose vectors are complete and
    visible to search: the groups as the pipeline formed them."""
    from orchestration.cli.context import open_queue
    from queue_db.config import Settings
    from queue_db.lifecycle import hidden_from_search

    queue = open_queue(Settings.from_env())
    hidden = set(hidden_from_search(queue))
    with queue.engine.connect() as conn:
        rows = conn.exec_driver_sql(
            """SELECT d.id, d.document_key, d.filename, m.group_id
               FROM documents d LEFT JOIN content_group_members m ON m.document_id = d.id
               WHERE d.vector_index_status = 'completed' ORDER BY d.document_key"""
        ).all()
    return [(key, name, group and str(group)) for doc_id, key, name, group in rows if str(doc_id) not in hidden]


def _prose_lines(markdown: str) -> list[str]:
    """A page's lines of prose (not table rows, headings or code fences), markup removed."""
    prose = [line for line in markdown.splitlines() if line.strip() and not line.lstrip().startswith(("|", "#", "```"))]
    return [_MARKUP.sub(lambda m: m.group(1) or " ", line) for line in prose]


def sentences(markdown: str) -> list[str]:
    """Prose sentences of a page: table rows and headings left out, markup removed."""
    text = " ".join(_prose_lines(markdown))
    found = []
    for sentence in _SENTENCE_END.split(" ".join(text.split())):
        words = sentence.split()
        if MIN_WORDS <= len(words) <= MAX_WORDS and sum(
            bool(_WORD.fullmatch(w.strip(".,;:!?()\"'"))) for w in words
        ) >= 0.7 * len(words):
            found.append(sentence)
    return found


def _content_words(text: str) -> list[str]:
    return [word for word in _WORD.findall(text) if len(word) >= 4 and word.lower() not in STOPWORDS]


def _word_string(text: str) -> str:
    """`text` as its words (letters and digits, case folded) between single spaces, with a space at each end, so
    that `_word_string(sentence) in _word_string(page)` says the page holds the sentence's words in that order."""
    return " " + " ".join(text_words(text.casefold())) + " "


def sentence_places(pages: list[Page]) -> dict[tuple[str, int], dict[str, set[tuple[str, int]]]]:
    """Per page, its sentences and the pages (document key, page number) whose prose holds each one's words in the
    same order. Words, not characters: a copy of the page differs in what no search reads — emphasis marks
    (`_loop traces_` in a text-layer page's markdown, `loop traces` in its re-scan's OCR), a space before a comma,
    where a sentence splitter cut — and a sentence whose words are in two documents cannot tell them apart."""
    prose = {(p.document_key, p.page_number): _word_string(" ".join(_prose_lines(p.markdown))) for p in pages}
    places: dict[tuple[str, int], dict[str, set[tuple[str, int]]]] = {}
    for p in pages:
        found = places.setdefault((p.document_key, p.page_number), {})
        for sentence in dict.fromkeys(sentences(p.markdown)):
            words = _word_string(sentence)
            found[sentence] = {where for where, text in prose.items() if words in text}
    return places


def sample_shared_queries(
    pages: list[Page], count: int, seed: int, family_of: dict[str, str] | None = None
) -> list[Query]:
    """`count` verbatim sentences whose words are found in more than one document, each attributed to one page it
    is on, drawn with random.Random(seed). With `family_of` (document key: family), only sentences whose documents
    are all of one family: a sentence of boilerplate that documents of several families share (a notice page)
    names no document a search could find (`boilerplate_sentences` counts them)."""
    places = sentence_places(pages)
    candidates = sorted(
        (key, s)
        for key, found in places.items()
        for s, where in found.items()
        if len({d for d, _ in where}) > 1 and len(_families(where, family_of)) == 1
    )
    chosen = random.Random(seed).sample(candidates, min(count, len(candidates)))
    return [Query("shared", sentence, document_key, page) for (document_key, page), sentence in chosen]


def _families(where: set[tuple[str, int]], family_of: dict[str, str] | None) -> set[str]:
    """The families of the documents holding a sentence (each its own family without `family_of`)."""
    return {family_of.get(d, d) if family_of else "one" for d, _ in where}


def boilerplate_sentences(pages: list[Page], family_of: dict[str, str]) -> int:
    """How many distinct sentences documents of more than one family share."""
    return len(
        {
            s
            for found in sentence_places(pages).values()
            for s, where in found.items()
            if len(_families(where, family_of)) > 1
        }
    )


def sample_queries(pages: list[Page], count: int, seed: int, keywords: int) -> list[Query]:
    """`count` sentences whose words are on one page only (`sentence_places`), drawn with random.Random(seed), each
    as a verbatim query and as a keyword query."""
    candidates = sorted(
        (key, s) for key, found in sentence_places(pages).items() for s, where in found.items() if len(where) == 1
    )
    frequency = Counter(w.lower() for p in pages for w in set(_content_words(p.markdown)))
    chosen = random.Random(seed).sample(candidates, min(count, len(candidates)))
    queries = []
    for (document_key, page_number), sentence in chosen:
        words = list(dict.fromkeys(_content_words(sentence)))
        rarest = set(sorted(words, key=lambda w: (frequency[w.lower()], w))[:keywords])
        queries.append(Query("sentence", sentence, document_key, page_number))
        queries.append(Query("keywords", " ".join(w for w in words if w in rarest), document_key, page_number))
    return [q for q in queries if q.text]


# ------------------------------------------------------------------------------------------------ evaluation
def search(text: str, mode: str = "hybrid", all_copies: bool = False) -> list[dict]:
    """The hits of `docqueue search TEXT --json` (with --dense or --sparse for those modes, --all for every copy),
    run in this process (the command's own code)."""
    from click.testing import CliRunner

    from orchestration.cli import main

    flags = ([] if mode == "hybrid" else [f"--{mode}"]) + (["--all"] if all_copies else [])
    # `--` ends the options: a sentence may begin with a dash (a list item of the page it came from)
    result = CliRunner().invoke(
        main, ["search", "--limit", str(SEARCH_LIMIT), "--json", *flags, "--", text], catch_exceptions=False
    )
    if result.exit_code != 0:
        raise SystemExit(f"docqueue search failed ({result.exit_code}): {result.output[-2000:]}")
    found = json.loads(result.stdout)
    if found.get("mode", mode) != mode:
        raise SystemExit(f"docqueue search ran {found['mode']} instead of {mode}: {found.get('notice')}")
    return found["hits"]


def evaluate(queries: list[Query], mode: str = "hybrid", misses: list[dict] | None = None) -> dict[str, dict]:
    """Per query type, the figures of `queries` searched in `mode`; with `misses` (a list), each sentence query whose
    first hit is not from its document is appended to it, with what ranked instead (`miss_record`)."""
    totals: dict[str, Counter] = {}
    for query in queries:
        hits = search(query.text, mode)
        if (
            misses is not None
            and query.kind == "sentence"
            and (not hits or hits[0]["document_key"] != query.document_key)
        ):
            misses.append(miss_record(query, hits, mode))
        documents = [hit["document_key"] for hit in hits]
        pages = [(hit["document_key"], hit["page"]) for hit in hits]
        rank = next((i + 1 for i, key in enumerate(documents) if key == query.document_key), None)
        total = totals.setdefault(query.kind, Counter())
        total["queries"] += 1
        for k in RANKS:
            total[f"doc_hit_at_{k}"] += query.document_key in documents[:k]
        total["page_hit_at_5"] += (query.document_key, query.page_number) in pages[:5]
        # a collapsed hit stands for its whole content group: the document the sentence came from may be a copy
        named = [{hit["document_key"], *hit.get("also_in_keys", [])} for hit in hits]
        total["group_hit_at_1"] += any(query.document_key in keys for keys in named[:1])
        total["group_hit_at_5"] += any(query.document_key in keys for keys in named[:5])
        total["mrr"] += 1 / rank if rank else 0
    return {
        kind: {
            "queries": total["queries"],
            **{name: round(value / total["queries"], 4) for name, value in total.items() if name != "queries"},
        }
        for kind, total in totals.items()
    }


def miss_record(query: Query, hits: list[dict], mode: str) -> dict:
    """What a missed sentence query found: the collapsed hits as users get them, and every copy's rank (`--all`),
    with whether the query's words, in order, are in each hit's chunk text, so a miss can be classed by reading
    it."""
    every = search(query.text, mode, all_copies=True)
    wanted = _word_string(query.text)

    def brief(rank: int, hit: dict) -> dict:
        text = _word_string(hit.get("text") or "")
        return {
            "rank": rank,
            "document_key": hit["document_key"],
            "page": hit["page"],
            "chunk": hit.get("chunk"),
            "score": hit.get("score"),
            "also_in_keys": hit.get("also_in_keys", []),
            "words_in_chunk": wanted in text,
            "text": (hit.get("text") or "")[:300],
        }

    own = next((i for i, hit in enumerate(every, 1) if hit["document_key"] == query.document_key), None)
    return {
        "query": query.text,
        "document_key": query.document_key,
        "page": query.page_number,
        "mode": mode,
        "collapsed": [brief(i, hit) for i, hit in enumerate(hits[:3], 1)],
        "own_rank_all_copies": own,
        "all_copies": [brief(i, hit) for i, hit in enumerate(every[:6], 1)],
    }


def run(
    folders: list[Path],
    *,
    queries: int,
    seed: int,
    keywords: int,
    max_documents: int | None,
    process_inputs: bool,
    workers: int,
    timeout: float,
    suffixes: str = DEFAULT_SUFFIXES,
    modes: tuple[str, ...] = ("hybrid",),
    plant_copies: int = 0,
    text_layer_only: bool = False,
    misses: list[dict] | None = None,
    plant_boilerplate: int = 0,
) -> dict:
    """The whole evaluation in this process's environment (DOCQUEUE_HOME and servers already chosen); `misses`
    collects the first mode's missed sentence queries (`evaluate`)."""
    seconds, planted = None, []
    with tempfile.TemporaryDirectory(prefix="docqueue-planted-") as scratch:
        if process_inputs:
            chosen = select_inputs(folders, max_documents, suffixes, text_layer_only)
            if not chosen:
                raise SystemExit(f"no documents in {', '.join(map(str, folders))}")
            planted = _planted.plant(chosen, plant_copies, Path(scratch), seed, plant_boilerplate, _read_limits())
            seconds = process([*chosen, *planted], workers, timeout)
    pages, corpus = indexed_pages()
    inputs = _planted.input_families(select_inputs(folders, max_documents, suffixes, text_layer_only))
    documents = content_groups()
    groups = _planted.group_scores(documents, inputs)
    family_of = {key: inputs.get(_planted.family(name), _planted.family(name)) for key, name, _ in documents}
    groups["boilerplate_sentences"] = boilerplate_sentences(pages, family_of)
    groups["notice_documents"] = sum(1 for _, name, _ in documents if name.startswith(_planted.NOTICE_PREFIX))
    sampled = sample_queries(pages, queries, seed, keywords) + sample_shared_queries(pages, queries, seed, family_of)
    by_mode, search_seconds = {}, {}
    for mode in modes:  # the same queries in every mode, one mode after the other
        started = time.perf_counter()
        by_mode[mode] = evaluate(sampled, mode, misses if mode == modes[0] else None)
        search_seconds[mode] = round(time.perf_counter() - started, 1)
    if misses:
        # the other pages holding the sentence's words in order, wherever their sentences were cut
        prose = {(p.document_key, p.page_number): _word_string(" ".join(_prose_lines(p.markdown))) for p in pages}
        for miss in misses:
            words = _word_string(miss["query"])
            miss["words_also_on"] = sorted(
                f"{key}#{page}" for (key, page), text in prose.items() if words in text and key != miss["document_key"]
            )
    return {
        "corpus": {
            **corpus,
            "folders": [str(f) for f in folders],
            "max_documents": max_documents,
            "processing_seconds": round(seconds, 1) if seconds is not None else None,
            "planted_files": [path.name for path in planted],
        },
        "groups": groups,
        "seed": seed,
        "keywords": keywords,
        "search_seconds": search_seconds[modes[0]],
        "mode": modes[0],
        "by_type": by_mode[modes[0]],
        "by_mode": by_mode,
        "search_seconds_by_mode": search_seconds,
    }


def _figures(by_type: dict) -> dict:
    verbatim, short = by_type.get("sentence", {}), by_type.get("keywords", {})
    line = {name: verbatim.get(name) for name in ("doc_hit_at_1", "doc_hit_at_5", "page_hit_at_5", "mrr")}
    line.update(
        {f"keywords_{name}": short.get(name) for name in ("doc_hit_at_1", "doc_hit_at_5", "page_hit_at_5", "mrr")}
    )
    return line


def result_line(report: dict) -> dict:
    verbatim, short = report["by_type"].get("sentence", {}), report["by_type"].get("keywords", {})
    line = {**_figures(report["by_type"]), "mode": report.get("mode", "hybrid")}
    if len(report.get("by_mode", {})) > 1:
        line["by_mode"] = {mode: _figures(by_type) for mode, by_type in report["by_mode"].items()}
    shared = report["by_type"].get("shared", {})
    line.update(
        {
            "unique_doc_hit_at_1": verbatim.get("doc_hit_at_1"),
            "group_hit_at_1": shared.get("group_hit_at_1"),
            # keywords rarely tell a document from its near-copy: a collapsed hit naming it finds it
            "keywords_group_hit_at_5": short.get("group_hit_at_5"),
            "shared_queries": shared.get("queries", 0),
            **{k: report["groups"][k] for k in ("group_precision", "group_recall", "planted_copies", "groups")},
            "notice_documents": report["groups"].get("notice_documents", 0),
            "boilerplate_sentences": report["groups"].get("boilerplate_sentences", 0),
            "queries": verbatim.get("queries", 0),
            "keyword_queries": short.get("queries", 0),
            **{k: report["corpus"][k] for k in ("documents", "pages", "chunks", "max_chunk_tokens")},
            "seed": report["seed"],
        }
    )
    return line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="*", type=Path, default=[DEFAULT_CORPUS])
    parser.add_argument("--queries", type=int, default=100, help="sentences sampled (each also as keywords)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keywords", type=int, default=4, help="words in a keyword query")
    parser.add_argument("--max-documents", type=int, default=None, help="only the first N files (sorted by path)")
    parser.add_argument("--suffixes", default=DEFAULT_SUFFIXES, help="file types to ingest, comma-separated")
    parser.add_argument("--home", type=Path, default=None, help="DOCQUEUE_HOME to fill and keep (default: scratch)")
    parser.add_argument("--no-process", action="store_true", help="evaluate --home as it is")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=7200, help="seconds allowed for `docqueue run`")
    parser.add_argument(
        "--modes",
        default="hybrid",
        help="search modes to compare, comma-separated (hybrid, dense, sparse); the first one's "
        "figures are RESULT's top-level keys",
    )
    parser.add_argument("--plant-copies", type=int, default=0, help="a version and a re-scan of N inputs")
    parser.add_argument("--text-layer-only", action="store_true", help="only inputs with a text layer")
    parser.add_argument(
        "--plant-boilerplate", type=int, default=0, help="N documents sharing a notice page, no copies of each other"
    )
    parser.add_argument(
        "--misses", type=Path, default=None, help="write the missed sentence queries (doc-hit@1) as JSON to FILE"
    )
    args = parser.parse_args(argv)
    modes = tuple(dict.fromkeys(m.strip() for m in args.modes.split(",") if m.strip()))
    if not modes or set(modes) - set(MODES):
        parser.error(f"--modes takes a comma-separated choice of {', '.join(MODES)}, got {args.modes!r}")
    if args.no_process and args.home is None:
        parser.error("--no-process needs --home")
    scratch = None if args.home else Path(tempfile.mkdtemp(prefix="docqueue-retrieval-"))
    home = args.home or scratch
    os.environ["DOCQUEUE_HOME"] = str(home.resolve())
    for name in (
        "DOCQUEUE_DATABASE_URL",
        "DOCQUEUE_DAGSTER_PG_URL",
        "DAGSTER_HOME",
        "DOCQUEUE_QDRANT_PATH",
        "DOCQUEUE_STORAGE_DIR",
    ):
        os.environ.pop(name, None)  # everything under the chosen home
    os.environ.setdefault("DOCQUEUE_PG_PORT", str(_free_port()))
    if not os.environ.get("DOCQUEUE_NEO4J_URI"):
        os.environ.setdefault("DOCQUEUE_BOLT_PORT", str(_free_port()))
    misses: list[dict] = []
    try:
        report = run(
            args.folders,
            queries=args.queries,
            seed=args.seed,
            keywords=args.keywords,
            max_documents=args.max_documents,
            process_inputs=not args.no_process,
            workers=args.workers,
            timeout=args.timeout,
            suffixes=args.suffixes,
            modes=modes,
            plant_copies=args.plant_copies,
            text_layer_only=args.text_layer_only,
            misses=misses if args.misses else None,
            plant_boilerplate=args.plant_boilerplate,
        )
    finally:
        if scratch is not None:
            subprocess.run(
                [sys.executable, "-m", "orchestration.cli", "db", "stop"],
                cwd=REPO,
                env=os.environ.copy(),
                capture_output=True,
                timeout=120,
            )
            shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(report, indent=2))
    if args.misses:
        args.misses.write_text(json.dumps(misses, indent=2, ensure_ascii=False))
        print(f"{len(misses)} missed sentence queries written to {args.misses}")
    for mode, by_type in report["by_mode"].items():
        for kind, figures in by_type.items():
            print(
                f"{mode:6s} {kind:9s} n={figures['queries']:4d}  doc@1 {figures['doc_hit_at_1']:.3f}  "
                f"doc@5 {figures['doc_hit_at_5']:.3f}  page@5 {figures['page_hit_at_5']:.3f}  "
                f"MRR {figures['mrr']:.3f}  group@1 {figures['group_hit_at_1']:.3f}"
            )
    print(f"content groups: {json.dumps(report['groups'])}")
    print_result(result_line(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
