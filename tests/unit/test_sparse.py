import subprocess
import sys
import zlib

from processing.sparse import K1, document_vector, query_vector, term_id, tokens


def test_tokens_lowercase_unicode_words_without_stopwords():
    assert tokens("The Ölbaum, and café-Straße 42!") == ["ölbaum", "café", "straße", "42"]
    assert tokens("") == [] and tokens("the of and") == []


def test_term_ids_are_crc32_and_stable_across_processes():
    assert term_id("lessig") == zlib.crc32(b"lessig")
    other = subprocess.run(
        [sys.executable, "-c", "from processing.sparse import term_id; print(term_id('lessig'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert int(other.stdout) == term_id("lessig")


def test_document_weights_saturate_with_frequency_and_fall_with_length():
    indices, values = document_vector("copyright copyright copyright law")
    weights = dict(zip(indices, values))
    assert indices == sorted(indices) and len(indices) == 2
    assert weights[term_id("copyright")] > weights[term_id("law")]
    assert weights[term_id("copyright")] < K1 + 1  # BM25's tf part is bounded by k1 + 1
    short = dict(zip(*document_vector("copyright law")))[term_id("law")]
    long = dict(zip(*document_vector("copyright law " + "filler " * 300)))[term_id("law")]
    assert short > long


def test_query_vector_counts_each_term_once():
    indices, values = query_vector("Law and law, LAW")
    assert indices == [term_id("law")] and values == [1.0]
    assert query_vector("the and") == ([], [])
