"""Duplicate entities within a document, before and after short-form resolution, on real PDFs.

Each PDF of the corpus is read through PyMuPDF's text layer (no OCR: scanned, encrypted and broken files give no
text and are skipped), each page is chunked as the pipeline chunks it, and the real spaCy extractor (with its type
rules) runs over the chunks.  Per document, over the distinct (normalised name, type) pairs:

- subset: an entity whose name's words are a proper subset of another entity's of the same type ("lessig" and
  "lawrence lessig"), the duplicates resolution targets; counted before and after `resolve_aliases`;
- rejected: names the type rules turned down, per type (distinct per chunk).

Ends with one line `RESULT {json}`.

    .venv/bin/python bench/entity_resolution.py [--corpus ../shared/corpus] [--examples 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._result import print_result  # noqa: E402
from processing.chunking import ChunkingError, chunk_markdown  # noqa: E402
from processing.entities import resolve_aliases  # noqa: E402
from resources.extraction import SpacyExtractor  # noqa: E402

DEFAULT_CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus"


def page_chunks(path: Path) -> list[str]:
    """The chunk texts of a PDF's text layer; [] when it cannot be opened without a password or at all."""
    import pymupdf

    try:
        doc = pymupdf.open(path)
    except Exception:  # noqa: BLE001 - a corrupt file is part of the corpus, not a bench failure
        return []
    with doc:
        if doc.needs_pass:
            return []
        chunks = []
        for number in range(1, doc.page_count + 1):
            try:
                text = doc[number - 1].get_text("text")
                chunks.extend(c.text for c in chunk_markdown(text, page_key=f"{path.name}:{number}"))
            except (ChunkingError, RuntimeError, pymupdf.mupdf.FzErrorBase):
                continue  # a page PyMuPDF cannot read or too large to chunk: the pipeline fails it too
        return chunks


def subset_entities(pairs: set[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """(key, type, a longer key of that type containing all its words) for every such entity."""
    by_word: dict[tuple[str, str], list[frozenset[str]]] = {}
    words_of = {pair: frozenset(pair[0].split()) for pair in pairs}
    for (key, type_), words in words_of.items():
        for word in words:
            by_word.setdefault((type_, word), []).append(words)
    found = []
    for (key, type_), words in sorted(words_of.items()):
        rarest = min((by_word[(type_, word)] for word in words), key=len)
        longer = [other for other in rarest if words < other]
        if longer:
            found.append((key, type_, " ".join(sorted(min(longer, key=len)))))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--examples", type=int, default=5, help="resolved aliases shown per document")
    args = parser.parse_args()

    extractor = SpacyExtractor()
    started = time.perf_counter()
    totals: Counter = Counter()
    rejected: Counter = Counter()
    for path in sorted(args.corpus.glob("*.pdf")):
        texts = page_chunks(path)
        if not texts:
            totals["documents_without_text"] += 1
            continue
        extractions = extractor.extract(texts)
        pairs = {(entity.key, entity.type) for extraction in extractions for entity in extraction.entities}
        for extraction in extractions:
            rejected.update(extraction.rejected)
        canonical = resolve_aliases(pairs)
        after = {(canonical.get(key, key), type_) for key, type_ in pairs}
        before_subsets, after_subsets = subset_entities(pairs), subset_entities(after)
        totals.update(
            documents=1,
            chunks=len(texts),
            entities_before=len(pairs),
            entities_after=len(after),
            subset_before=len(before_subsets),
            subset_after=len(after_subsets),
            aliases=len(canonical),
            person_before=sum(1 for _, t in pairs if t == "PERSON"),
            person_after=sum(1 for _, t in after if t == "PERSON"),
            person_subset_before=sum(1 for _, t, _ in before_subsets if t == "PERSON"),
            person_subset_after=sum(1 for _, t, _ in after_subsets if t == "PERSON"),
        )
        print(
            f"{path.name}: {len(texts)} chunks, {len(pairs)} -> {len(after)} entities, subset "
            f"{len(before_subsets)} -> {len(after_subsets)}; resolved {sorted(canonical.items())[: args.examples]}; "
            f"still subset {after_subsets[: args.examples]}",
            file=sys.stderr,
        )

    def rate(part: str, whole: str) -> float:
        return round(totals[part] / totals[whole], 4) if totals[whole] else 0.0

    result = {
        **{name: totals[name] for name in sorted(totals)},
        "subset_rate_before": rate("subset_before", "entities_before"),
        "subset_rate_after": rate("subset_after", "entities_after"),
        "person_subset_rate_before": rate("person_subset_before", "person_before"),
        "person_subset_rate_after": rate("person_subset_after", "person_after"),
        "person_rejected": rejected["PERSON"],
        "rejected_by_type": dict(sorted(rejected.items())),
        "seconds": round(time.perf_counter() - started, 1),
    }
    print_result(result, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
