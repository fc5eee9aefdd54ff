"""The similarity signature (processing/near_duplicates.py): stable across processes, an estimate of the shingle
sets' Jaccard similarity, bands that near duplicates share, what it folds, and the bounds it reads within."""

from __future__ import annotations

import random
import subprocess
import sys

from processing.near_duplicates import (
    BANDS,
    FORMAT,
    NUM_PERM,
    SHINGLE_CHARS,
    SignatureLimits,
    estimated_jaccard,
    folded,
    shingle_hashes,
    shingle_text,
    signature,
)

WORDS = [f"w{i}" for i in range(2000)]


def text(seed: int, words: int = 300) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def shingles(page: str) -> set[str]:
    text = shingle_text([page], 10**9)
    return {text[i : i + SHINGLE_CHARS] for i in range(len(text) - SHINGLE_CHARS + 1)}


def test_the_signature_is_the_same_in_another_process():
    here = signature(["The harbour wall broke in the storm of 1953."])
    probe = (
        "from processing.near_duplicates import signature;"
        "s = signature(['The harbour wall broke in the storm of 1953.']); print(list(s.values)); print(s.bands())"
    )
    there = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    values, bands = there.stdout.strip().splitlines()
    assert here is not None and values == str(list(here.values)) and bands == str(here.bands())
    # fixed by the format: a change here is a new FORMAT, and documents signed before are signed again
    assert len(here.values) == NUM_PERM and len(here.bands()) == BANDS and here.values[:2] == (4994888, 8279244)
    assert FORMAT == 2


def test_the_estimate_follows_the_jaccard_similarity():
    page = text(1)
    words = page.split()
    for changed in (1, 5, 20):
        edited = list(words)
        for i in range(changed):
            edited[10 + i * 13] = f"edit{i}"
        other = " ".join(edited)
        truth = len(shingles(page) & shingles(other)) / len(shingles(page) | shingles(other))
        first, second = signature([page]), signature([other])
        assert first is not None and second is not None
        assert abs(estimated_jaccard(first, second) - truth) < 0.12, (changed, truth)
    assert estimated_jaccard(signature([text(1)]), signature([text(2)])) < 0.1  # type: ignore[arg-type]


def test_near_duplicates_share_a_band_and_unrelated_texts_do_not():
    page = text(3)
    edited = page.split()
    edited[100] = "different"
    near, far = signature([page]), signature([" ".join(edited)])
    unrelated = signature([text(4)])
    assert near is not None and far is not None and unrelated is not None
    assert set(near.bands()) & set(far.bands())
    assert not set(near.bands()) & set(unrelated.bands())


def test_case_and_punctuation_do_not_matter_and_empty_text_has_no_signature():
    assert signature(["Storm, harbour; wall!"]) == signature(["storm harbour wall"])
    assert signature(["", "  \n", "—"]) is None
    assert signature(["one"]) is not None  # fewer words than a shingle: the words are one shingle


def test_the_bounds_hold():
    long = [text(5, 5000)]
    assert shingle_hashes(long, SignatureLimits(max_chars=10_000_000, max_shingles=100)).size == 100
    short = shingle_hashes(long, SignatureLimits(max_chars=40, max_shingles=10_000))
    assert 0 < short.size <= 40 - SHINGLE_CHARS + 1
    # the bound keeps the first distinct shingles: a document's beginning
    first = shingle_hashes(long, SignatureLimits(max_chars=10_000_000, max_shingles=50))
    assert list(first) == list(shingle_hashes(long, SignatureLimits(max_chars=10_000_000, max_shingles=10**6))[:50])


def test_markup_does_not_count_as_words():
    from processing.words import text_words

    assert text_words("<mark>Lorem _ipsum_</mark> **dolor** O(n<sup>k</sup>) snake_case <br/>") == [
        "Lorem",
        "ipsum",
        "dolor",
        "O",
        "n",
        "k",
        "snake",
        "case",
    ]
    # a text-layer page's highlighted lines sign as its plain re-scan does
    plain = "Lorem ipsum dolor sit amet, consetetur sadipscing elitr.\nAt vero eos et accusam et justo duo dolores."
    marked = "\n".join(f"<mark>{line}</mark>" for line in plain.splitlines())
    assert signature([marked]) == signature([plain]) != signature(["mark " + plain])
    assert signature(["the _loop traces_ grow"]) == signature(["the loop traces grow"])


def test_case_diacritics_and_latin_look_alikes_fold_away():
    assert folded("Été NAÏVE ﬁn") == "ete naive fin"
    # a bad text layer reads Russian print as Latin look-alikes; the letters whose capitals print alike compare equal
    assert signature(["СТАТЬЯ НАЛОГОВОГО КОДЕКСА"]) == signature(["CTATЬЯ HAЛOГOBOГO KOДEKCA"])
    assert signature(["Сумма"]) == signature(["CyMMa"]) and signature(["κατοχή"]) == signature(["KATOXH"]) is not None
    # letters without a Latin look-alike stay themselves
    assert folded("Жизнь") == "жизhь"
    assert signature(["Жизнь"]) != signature(["Zizn"])


def test_a_letter_read_wrong_or_blocks_in_another_order_leave_the_estimate_high():
    rng = random.Random(9)
    vocabulary = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9))) for _ in range(800)
    ]
    blocks = [" ".join(rng.choice(vocabulary) for _ in range(rng.randint(2, 6))) for _ in range(120)]
    original = "\n".join(blocks)
    # form fields in another order: the blocks shuffled in runs of a few
    runs = [blocks[i : i + 4] for i in range(0, len(blocks), 4)]
    rng.shuffle(runs)
    reordered = "\n".join(block for run in runs for block in run)
    # OCR: one letter in twenty words read wrong
    words = original.split()
    misread = " ".join(w[:-1] + "x" if i % 20 == 0 else w for i, w in enumerate(words))
    first = signature([original])
    assert first is not None
    for copy in (reordered, misread):
        truth = len(shingles(original) & shingles(copy)) / len(shingles(original) | shingles(copy))
        assert truth > 0.8 and estimated_jaccard(first, signature([copy])) >= 0.7, truth  # type: ignore[arg-type]
