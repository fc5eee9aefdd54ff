"""bench/retrieval.py on a generated corpus: the real pipeline, the real `docqueue search`, and a floor under the
known-item figures (a regression guard on what users get out, not a timed test)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from tests import pdf_factory as pf
from tests.figures import announce

BENCH = Path(__file__).resolve().parents[2] / "bench" / "retrieval.py"

TOPICS = {
    "orchard": [
        [
            "# Apple Orchard Care",
            "Apple trees are pruned in late winter, before the buds swell, so that light reaches the centre of the "
            "crown.",
            "Growers thin the young fruit in early summer and leave one apple per cluster to get larger fruit.",
            "Codling moth larvae tunnel into the fruit, and pheromone traps tell the grower when to act.",
        ],
        [
            "## Harvest and Storage",
            "Ripe apples come off the spur with a gentle upward twist, and the seeds inside have turned brown.",
            "Cold stores keep the harvest at one degree with little oxygen, which slows ripening for months.",
            "Bruised fruit releases ethylene gas and spoils the sound apples stored beside it in the crate.",
        ],
    ],
    "railways": [
        [
            "# Narrow Gauge Railways",
            "Narrow gauge lines were laid through mountain valleys where a standard track would cost far too much.",
            "Tight curves and steep gradients let the small locomotives climb to mines and quarries high above.",
            "Many of these railways closed when lorries took over the freight after the second world war.",
        ],
        [
            "## Preservation",
            "Volunteers restored the steam engines in the old sheds and now run tourist trains every summer weekend.",
            "The boiler of a steam locomotive is inspected by an engineer every ten years before it may be fired.",
            "Coal, water and a fireman's patience decide how fast the train reaches the summit station.",
        ],
    ],
    "glaciers": [
        [
            "# How Glaciers Move",
            "A glacier forms where more snow falls in winter than melts in summer, year after year for centuries.",
            "The weight of the ice makes it flow downhill, sliding on meltwater at its bed and deforming inside.",
            "Crevasses open where the ice speeds up over a steep step in the valley floor beneath it.",
        ],
        [
            "## Retreating Ice",
            "Most Alpine glaciers have lost a third of their length since the end of the little ice age.",
            "Scientists drill stakes into the surface and measure each autumn how much of them the melt exposed.",
            "Meltwater lakes dammed by moraines can burst and flood the villages further down the valley.",
        ],
    ],
}


def _load_bench():
    spec = importlib.util.spec_from_file_location("bench_retrieval", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


def _report(request, text: str) -> None:
    announce(request, text)


def _assert_vectors_cover_their_chunks(query: str) -> None:
    """The vector phase writes each chunk's length and the part its vector covers into the point's payload."""
    from processing.tokenizer import count_tokens
    from queue_db.config import Settings
    from resources.embedding_resource import EmbeddingResource
    from resources.vector_resource import QdrantResource

    embedder = EmbeddingResource.from_settings(Settings.from_env()).get_embedder()
    with QdrantResource.from_settings(Settings.from_env()).get_store(embedder.model_id, embedder.dim) as store:
        hits = store.search(embedder.embed_one(query), limit=3)
    assert hits
    for hit in hits:
        assert hit.payload["tokens"] == hit.payload["embedded_tokens"] == count_tokens(hit.payload["text"])


def test_known_item_retrieval_stays_above_its_floor(docqueue_env, tmp_path: Path, request):
    retrieval = _load_bench()
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name, pages in TOPICS.items():
        pf.text_pdf(corpus, f"{name}.pdf", pages)
    # one document also as a version with a word changed per page and as an image-only re-scan read by OCR
    report = retrieval.run(
        [corpus],
        queries=30,
        seed=7,
        keywords=4,
        max_documents=None,
        process_inputs=True,
        workers=1,
        timeout=900,
        plant_copies=1,
    )
    assert report["corpus"]["planted_files"] == ["planted-version__glaciers.pdf", "planted-rescan__glaciers.pdf"]
    assert report["corpus"]["documents"] == 5 and report["corpus"]["pages"] == 10
    assert report["corpus"]["max_chunk_tokens"] <= 400
    sentence, keywords = report["by_type"]["sentence"], report["by_type"]["keywords"]
    assert sentence["queries"] == keywords["queries"] >= 15
    line = retrieval.result_line(report)
    _report(request, f"\nretrieval on the generated corpus: {json.dumps(line)}")
    # hybrid search (the default): keyword queries find their document as reliably as verbatim sentences
    assert line["mode"] == "hybrid"
    assert line["doc_hit_at_1"] >= 0.9 and line["page_hit_at_5"] >= 0.9 and line["mrr"] >= 0.9, report
    # the rarest words of a glaciers sentence are on its planted copies too: the collapsed hit may name the
    # original among its also-in documents, so the keyword floor is on the group-aware figure
    assert line["keywords_group_hit_at_5"] >= 0.9 and line["keywords_mrr"] >= 0.8, report
    assert line["keywords_doc_hit_at_5"] <= line["keywords_group_hit_at_5"]
    assert line["unique_doc_hit_at_1"] == line["doc_hit_at_1"]
    # the three glaciers documents form the one group: no other pair is grouped, and the copies' sentences find it
    assert line["planted_copies"] == 2 and report["groups"]["planted_pairs"] == 3, report["groups"]
    assert line["group_precision"] == 1.0 and line["group_recall"] == 1.0, report["groups"]
    assert line["shared_queries"] >= 10 and line["group_hit_at_1"] >= 0.9, report
    _assert_vectors_cover_their_chunks("Volunteers restored the steam engines in the old sheds")
    pages, _ = retrieval.indexed_pages()
    assert (
        retrieval.sample_queries(pages, 30, 7, 4)
        == retrieval.sample_queries(pages, 30, 7, 4)
        != retrieval.sample_queries(pages, 30, 8, 4)
    )


def test_sentences_leave_out_tables_headings_and_markup():
    retrieval = _load_bench()
    markdown = "\n".join(
        [
            "# A heading that is long enough to look like a sentence of eight words.",
            "|a table row|with enough words in its cells to pass as a sentence here|",
            "Short one. This **sentence** has [a link](http://x.org) and enough words to be sampled.",
        ]
    )
    assert retrieval.sentences(markdown) == ["This sentence has a link and enough words to be sampled."]


def test_a_sentence_whose_words_are_on_another_page_is_not_unique():
    retrieval = _load_bench()
    pages = [
        retrieval.Page("original", 1, "TraceMonkey focuses on _loop traces_, that originate\nat a loop edge."),
        retrieval.Page("rescan", 1, "TraceMonkey focuses on loop traces , that originate at a loop edge."),
        retrieval.Page("version", 1, "TraceMonkey focuses on loop secart, that originate at a loop edge."),
    ]
    places = retrieval.sentence_places(pages)
    # emphasis, spacing and line breaks aside, the original and the re-scan hold the same words: shared
    assert places[("original", 1)] == {
        "TraceMonkey focuses on loop traces , that originate at a loop edge.": {("original", 1), ("rescan", 1)}
    }
    assert places[("version", 1)]["TraceMonkey focuses on loop secart, that originate at a loop edge."] == {
        ("version", 1)
    }
    assert [q.document_key for q in retrieval.sample_queries(pages, 5, 7, 4) if q.kind == "sentence"] == ["version"]
    assert {q.document_key for q in retrieval.sample_shared_queries(pages, 5, 7)} == {"original", "rescan"}


def test_inputs_that_copy_each_other_are_one_family(tmp_path: Path):
    from bench import _planted

    lorem = (
        "Lorem ipsum dolor sit amet, consetetur sadipscing elitr, sed diam nonumy eirmod tempor invidunt ut labore "
        "et dolore magna aliquyam erat, sed diam voluptua. At vero eos et accusam et justo duo dolores et ea rebum. "
        "Stet clita kasd gubergren, no sea takimata sanctus est Lorem ipsum dolor sit amet."
    )
    pf.text_pdf(tmp_path, "a.pdf", [lorem])
    pf.text_pdf(tmp_path, "b.pdf", [lorem.replace("tempor", "tempus")])
    pf.text_pdf(tmp_path, "c.pdf", TOPICS["orchard"])
    families = _planted.input_families(sorted(tmp_path.glob("*.pdf")))
    assert families == {"a.pdf": "a.pdf", "b.pdf": "a.pdf"}
    documents = [
        ("ka", "a.pdf", "g"),
        ("kb", "b.pdf", "g"),
        ("kv", "planted-version__a.pdf", None),
        ("kc", "c.pdf", None),
    ]
    scores = _planted.group_scores(documents, families)
    # a and b grouped is right (they are one family); the version grouped with neither misses two of its 3 pairs
    assert scores["group_precision"] == 1.0 and scores["planted_pairs"] == 3 and scores["group_recall"] == 0.3333


def test_a_notice_shared_by_documents_of_several_families_is_no_known_item_query():
    retrieval = _load_bench()
    notice = "Please read this notice before you open any of the attached files from our office."
    pages = [
        retrieval.Page("letter-1", 1, notice + "\nThe harbour wall was repaired in spring with stone from the quarry."),
        retrieval.Page("letter-2", 1, notice + "\nOur orchard gave twice the apples after the new hives were set up."),
        retrieval.Page("report", 1, "Volunteers restored the steam engines in the old sheds near the station."),
        retrieval.Page("report-rescan", 1, "Volunteers restored the steam engines in the old sheds near the station."),
    ]
    families = {"letter-1": "letter-1", "letter-2": "letter-2", "report": "report", "report-rescan": "report"}
    shared = retrieval.sample_shared_queries(pages, 10, 7, families)
    # the report's sentence is on its re-scan, one family: asked; the notice is on two letters: counted, not asked
    assert {q.text for q in shared} == {"Volunteers restored the steam engines in the old sheds near the station."}
    assert retrieval.boilerplate_sentences(pages, families) == 1
    assert {q.text for q in retrieval.sample_shared_queries(pages, 10, 7)} >= {notice}
