"""Chunker behaviour on hand-written and generated markdown (real model tokenizer, no services)."""

from __future__ import annotations

import hashlib
import re
import shutil
from collections import Counter

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from processing import tokenizer as vendored_tokenizer
from processing.chunking import MAX_CHUNKS_PER_PAGE, Chunk, TooManyChunksError, chunk_markdown
from processing.tokenizer import count_tokens, load_tokenizer

SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank."


def paragraph(sentences: int, seed: str = "") -> str:
    return " ".join(f"{seed}Sentence {number} says that {SENTENCE}" for number in range(sentences))


def words_of(text: str) -> list[str]:
    return text.split()


def table(rows: int, columns: int = 3, cell: str = "value") -> str:
    header = "| " + " | ".join(f"Column {c}" for c in range(columns)) + " |"
    separator = "|" + "|".join("---" for _ in range(columns)) + "|"
    body = ["| " + " | ".join(f"{cell} r{r}c{c}" for c in range(columns)) + " |" for r in range(rows)]
    return "\n".join([header, separator, *body])


# --------------------------------------------------------------------------- basics


@pytest.mark.parametrize("markdown", ["", "   ", "\n\n\t \n"])
def test_empty_or_blank_markdown_gives_no_chunks(markdown):
    assert chunk_markdown(markdown, page_key="doc:1") == []


def test_small_page_is_one_chunk_with_hash_and_id():
    markdown = "Just one short paragraph."
    [chunk] = chunk_markdown(markdown, page_key="doc:1")
    assert chunk.index == 0
    assert chunk.text == markdown
    assert chunk.content_hash == hashlib.sha256(markdown.encode()).hexdigest()
    assert re.fullmatch(r"[0-9a-f]{32}", chunk.chunk_id)
    assert chunk.token_count == count_tokens(markdown) == 5
    assert chunk.heading == ""


def test_ids_are_deterministic_and_depend_on_page_key():
    markdown = "# Title\n\n" + paragraph(40)
    first = chunk_markdown(markdown, page_key="doc:1")
    again = chunk_markdown(markdown, page_key="doc:1")
    other_page = chunk_markdown(markdown, page_key="doc:2")
    assert first == again
    assert len(first) > 1
    assert [c.text for c in first] == [c.text for c in other_page]
    assert not {c.chunk_id for c in first} & {c.chunk_id for c in other_page}
    assert len({c.chunk_id for c in first}) == len(first)
    assert [c.index for c in first] == list(range(len(first)))


def test_token_counts_are_the_model_tokenizers_and_within_max():
    markdown = "# A\n\n" + paragraph(30) + "\n\n" + table(40) + "\n\n- item one\n- item two\n"
    chunks = chunk_markdown(markdown, page_key="p", target_tokens=120, overlap_tokens=16, max_tokens=200)
    tokenizer = load_tokenizer()
    for chunk in chunks:
        assert chunk.token_count == len(tokenizer.encode(chunk.text, add_special_tokens=False).ids)
        assert chunk.token_count <= 200


def test_prose_chunks_stay_near_the_target():
    chunks = chunk_markdown(paragraph(60), page_key="p", target_tokens=100, overlap_tokens=10, max_tokens=150)
    assert len(chunks) > 5
    assert all(c.token_count <= 100 + 10 for c in chunks)
    assert all(c.token_count >= 40 for c in chunks[:-1])  # greedy packing, not one sentence per chunk


# --------------------------------------------------------------------------- headings


def test_heading_starts_a_chunk_and_carries_its_path():
    markdown = "\n\n".join(
        [
            "Preamble text before any heading.",
            "# Report",
            "Intro paragraph.",
            "## Methods",
            "We measured things.",
            "### Details",
            "Fine print.",
            "## Results",
            "It worked.",
        ]
    )
    chunks = chunk_markdown(markdown, page_key="p")
    assert [(c.heading, c.text.splitlines()[0]) for c in chunks] == [
        ("", "Preamble text before any heading."),
        ("Report", "# Report"),
        ("Report > Methods", "## Methods"),
        ("Report > Methods > Details", "### Details"),
        ("Report > Results", "## Results"),
    ]
    assert chunks[-1].text == "## Results\n\nIt worked."


def test_consecutive_headings_share_one_chunk_and_emphasis_is_stripped_from_the_path():
    markdown = "# **Title**\n\n## _Section one_ ##\n\nBody text here."
    [chunk] = chunk_markdown(markdown, page_key="p")
    assert chunk.heading == "Title > Section one"
    assert chunk.text.startswith("# **Title**\n\n## _Section one_ ##\n\nBody")


def test_continuation_chunks_keep_the_heading_but_no_overlap_crosses_a_heading():
    markdown = "# Alpha\n\n" + paragraph(30, "Alpha ") + "\n\n# Beta\n\nBeta text."
    chunks = chunk_markdown(markdown, page_key="p", target_tokens=100, overlap_tokens=20, max_tokens=150)
    alpha = [c for c in chunks if c.heading == "Alpha"]
    assert len(alpha) > 2
    assert chunks[-1].heading == "Beta"
    assert chunks[-1].text == "# Beta\n\nBeta text."


def test_hash_signs_inside_code_fences_are_not_headings():
    markdown = "# Real\n\n```python\n# just a comment\nx = 1\n```\n\nAfter."
    [chunk] = chunk_markdown(markdown, page_key="p")
    assert chunk.heading == "Real"
    assert "# just a comment\nx = 1" in chunk.text


# --------------------------------------------------------------------------- tables


def test_table_that_fits_is_kept_whole():
    markdown = "Before.\n\n" + table(12) + "\n\nAfter."
    chunks = chunk_markdown(markdown, page_key="p", target_tokens=256, max_tokens=400)
    holding = [c for c in chunks if "| Column 0" in c.text]
    assert len(holding) == 1
    assert table(12) in holding[0].text


def test_table_between_target_and_max_is_kept_whole_in_its_own_chunk():
    markdown = paragraph(3) + "\n\n" + table(10) + "\n\n" + paragraph(2)
    tokens = count_tokens(table(10))
    assert 120 < tokens <= 260
    chunks = chunk_markdown(markdown, page_key="p", target_tokens=120, overlap_tokens=10, max_tokens=260)
    assert any(c.text == table(10) for c in chunks)


def test_long_table_is_split_between_rows_with_the_header_repeated():
    big = table(80)
    rows = big.splitlines()
    chunks = chunk_markdown(big, page_key="p", target_tokens=100, overlap_tokens=10, max_tokens=150)
    assert len(chunks) > 3
    seen_rows = []
    for chunk in chunks:
        lines = chunk.text.splitlines()
        assert lines[:2] == rows[:2]
        assert set(lines) <= set(rows)
        seen_rows.extend(lines[2:])
        assert chunk.token_count <= 150
    assert seen_rows == rows[2:]  # every row once, in order, no overlap inside tables


def test_table_without_separator_repeats_its_first_row():
    rows = ["| name | value |"] + [f"| key{r} | {r} units of something |" for r in range(60)]
    chunks = chunk_markdown("\n".join(rows), page_key="p", target_tokens=80, overlap_tokens=0, max_tokens=100)
    assert len(chunks) > 2
    assert all(c.text.splitlines()[0] == rows[0] for c in chunks)


# --------------------------------------------------------------------------- wide tables


def wide_table(columns: int, rows: int, header: list[str] | None = None, cell=None) -> str:
    names = header if header is not None else [f"Col{c + 1}" for c in range(columns)]
    cell = cell or (lambda r, c: f"r{r}c{c} door frame steel grade")
    lines = ["|" + "|".join(names) + "|", "|" + "---|" * columns]
    lines += ["|" + "|".join(cell(r, c) for c in range(columns)) + "|" for r in range(rows)]
    return "\n".join(lines)


def cell_texts(markdown: str) -> list[str]:
    return [
        cell.strip()
        for line in markdown.splitlines()
        for cell in line.strip().strip("|").split("|")
        if cell.strip() and not set(cell.strip()) <= set("-:")
    ]


def test_synthetic_column_names_are_dropped_with_their_separator():
    markdown = wide_table(4, 2)
    [chunk] = chunk_markdown(markdown, page_key="p")
    assert "Col" not in chunk.text and "---" not in chunk.text
    assert chunk.text.splitlines() == markdown.splitlines()[2:]


def test_synthetic_names_beside_real_ones_become_empty_header_cells():
    markdown = wide_table(4, 2, header=["Door", "Col2", "Width", "Col4"])
    [chunk] = chunk_markdown(markdown, page_key="p")
    assert chunk.text.splitlines()[0] == "|Door||Width||"
    assert chunk.text.splitlines()[1:] == markdown.splitlines()[1:]


def test_a_real_header_named_like_another_column_position_is_kept():
    markdown = wide_table(2, 2, header=["Col2", "Col1"])
    [chunk] = chunk_markdown(markdown, page_key="p")
    assert chunk.text == markdown


def test_a_row_longer_than_the_maximum_is_split_between_cells_under_its_column_names():
    names = [f"Name{c}" for c in range(28)]
    markdown = wide_table(28, 3, header=names)
    assert count_tokens(markdown.splitlines()[2]) > 150
    chunks = chunk_markdown(markdown, page_key="p", target_tokens=100, overlap_tokens=10, max_tokens=150)
    assert all(c.token_count <= 150 for c in chunks)
    assert chunks[0].text == markdown.splitlines()[0]  # the full header is too long to repeat: it goes once
    for chunk in chunks[1:]:
        lines = chunk.text.splitlines()
        header, separator, *body = lines
        columns = header.strip("|").split("|")
        assert set(columns) <= set(names) and separator == "|" + "---|" * len(columns)
        for row in body:  # every cell sits under its own column's name
            for name, value in zip(columns, row.strip("|").split("|")):
                assert value.startswith("r") and value.split()[0].endswith(f"c{name[4:]}")
    assert Counter(cell_texts(markdown)) - Counter(names) <= Counter(
        cell for c in chunks for cell in cell_texts(c.text)
    )


def test_a_cell_longer_than_the_maximum_is_cut_and_repeats_its_column_name():
    notes = " ".join(f"note{n} the slab is reinforced with steel mesh." for n in range(200))
    markdown = wide_table(3, 1, header=["Mark", "Notes", "Finish"], cell=lambda r, c: notes if c == 1 else f"mark{c}")
    chunks = chunk_markdown(markdown, page_key="p", target_tokens=100, overlap_tokens=10, max_tokens=150)
    assert all(c.token_count <= 150 for c in chunks)
    note_parts = [c.text.splitlines() for c in chunks if "note" in c.text]
    assert len(note_parts) > 10
    assert all(lines[:2] == ["|Notes|", "|---|"] for lines in note_parts)
    assert " ".join(lines[2].strip("|") for lines in note_parts) == notes


def test_an_unbroken_cell_is_cut_between_tokens_and_nothing_is_lost():
    run = "".join(f"x{n:03d}y" for n in range(600))  # no whitespace; WordPiece turns it into many tokens
    markdown = wide_table(2, 1, header=["Mark", "Code"], cell=lambda r, c: run if c == 1 else "m1")
    chunks = chunk_markdown(markdown, page_key="p", target_tokens=64, overlap_tokens=0, max_tokens=80)
    assert all(c.token_count <= 80 for c in chunks)
    pieces = [c.text.splitlines()[-1].strip("|") for c in chunks if "Code" in c.text]
    assert "".join("".join(piece.split()) for piece in pieces) == "".join(run.split())


def test_a_header_too_long_to_repeat_goes_once_as_a_row():
    names = [f"long column name number {c} of the schedule" for c in range(30)]
    markdown = wide_table(30, 20, header=names, cell=lambda r, c: f"v{r}.{c}")
    chunks = chunk_markdown(markdown, page_key="p", target_tokens=100, overlap_tokens=0, max_tokens=150)
    assert all(c.token_count <= 150 for c in chunks)
    text = "\n".join(c.text for c in chunks)
    assert all(text.count(name + "|") >= 1 for name in names)
    assert Counter(cell_texts(markdown)) - Counter(names) <= Counter(
        cell for c in chunks for cell in cell_texts(c.text)
    )


# --------------------------------------------------------------------------- long text


def test_over_long_paragraph_splits_at_sentence_ends():
    chunks = chunk_markdown(paragraph(40), page_key="p", target_tokens=90, overlap_tokens=0, max_tokens=120)
    assert len(chunks) > 3
    assert all(c.text.endswith(".") for c in chunks)
    assert all(c.text.startswith("Sentence ") for c in chunks)


def test_over_long_sentence_splits_between_words():
    sentence = " ".join(f"word{n}" for n in range(400)) + "."
    chunks = chunk_markdown(sentence, page_key="p", target_tokens=64, overlap_tokens=0, max_tokens=80)
    assert len(chunks) > 3
    assert " ".join(c.text for c in chunks) == sentence
    assert all(c.token_count <= 64 for c in chunks)


def test_overlap_repeats_the_end_of_the_previous_chunk_from_a_sentence_start():
    chunks = chunk_markdown(paragraph(40), page_key="p", target_tokens=100, overlap_tokens=30, max_tokens=150)
    assert len(chunks) > 3
    for previous, current in zip(chunks, chunks[1:]):
        first_sentence = current.text.split(". ")[0] + "."
        assert first_sentence in previous.text
        assert first_sentence.startswith("Sentence ")
        assert count_tokens(first_sentence) <= 30


def test_no_overlap_means_chunks_partition_the_words():
    markdown = paragraph(50)
    chunks = chunk_markdown(markdown, page_key="p", target_tokens=80, overlap_tokens=0, max_tokens=100)
    assert [w for c in chunks for w in words_of(c.text)] == words_of(markdown)


def test_lists_split_between_items():
    items = [f"- item {n}: {SENTENCE}" for n in range(40)]
    chunks = chunk_markdown("\n".join(items), page_key="p", target_tokens=100, overlap_tokens=0, max_tokens=120)
    assert len(chunks) > 3
    lines = [line for c in chunks for line in c.text.splitlines()]
    assert lines == items


def test_unspaced_run_longer_than_max_is_cut_to_stay_bounded():
    run = "-" * 3000  # every dash is its own token
    chunks = chunk_markdown(run, page_key="p", target_tokens=100, overlap_tokens=0, max_tokens=150)
    assert "".join(c.text for c in chunks) == run
    assert all(c.token_count <= 150 for c in chunks)


# --------------------------------------------------------------------------- limits and validation


def test_too_many_chunks_raises_instead_of_dropping_text():
    markdown = paragraph(60)
    with pytest.raises(TooManyChunksError, match="more than 3 chunks"):
        chunk_markdown(markdown, page_key="p", target_tokens=50, overlap_tokens=0, max_tokens=60, max_chunks=3)


def test_runaway_page_is_refused_before_tokenizing_it():
    with pytest.raises(TooManyChunksError, match="page has 100000 words"):
        chunk_markdown("word " * 100_000, page_key="p", max_tokens=400, max_chunks=200)


def test_max_chunks_default_is_the_settings_default():
    """The chunker reads no environment: its default is DOCQUEUE_MAX_CHUNKS_PER_PAGE's, the caller passes the
    configured value (the variable's parsing is tests/unit/test_settings.py's)."""
    from queue_db.config import StorageConfig

    assert MAX_CHUNKS_PER_PAGE == 200 == StorageConfig.model_fields["max_chunks_per_page"].default


@pytest.mark.parametrize(
    "kwargs", [{"target_tokens": 0}, {"overlap_tokens": -1}, {"overlap_tokens": 256}, {"max_tokens": 100}]
)
def test_invalid_budgets_are_rejected(kwargs):
    with pytest.raises(ValueError):
        chunk_markdown("text", page_key="p", **kwargs)


def test_page_key_is_required():
    with pytest.raises(ValueError, match="page_key"):
        chunk_markdown("text", page_key="")


def test_altered_tokenizer_file_is_refused(tmp_path, monkeypatch):
    altered = tmp_path / "tokenizer.json"
    shutil.copy(vendored_tokenizer.TOKENIZER_PATH, altered)
    with open(altered, "a") as handle:
        handle.write(" ")
    monkeypatch.setattr(vendored_tokenizer, "TOKENIZER_PATH", altered)
    with pytest.raises(RuntimeError, match="sha256"):
        load_tokenizer()


# --------------------------------------------------------------------------- properties

WORD = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFXYZ0123456789.,;:!?'()-é", min_size=1, max_size=14)
PROSE = st.lists(WORD, min_size=1, max_size=60).map(" ".join)


@st.composite
def markdown_pages(draw) -> str:
    blocks = []
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["heading", "paragraph", "paragraph", "list", "table", "code"]))
        if kind == "heading":
            level = draw(st.integers(1, 4))
            blocks.append("#" * level + " " + draw(st.lists(WORD, min_size=1, max_size=6).map(" ".join)))
        elif kind == "paragraph":
            lines = draw(st.lists(PROSE, min_size=1, max_size=3))
            blocks.append("\n".join(lines))
        elif kind == "list":
            items = draw(st.lists(PROSE, min_size=1, max_size=6))
            blocks.append("\n".join(f"- {item}" for item in items))
        elif kind == "table":
            columns = draw(st.integers(1, 4))
            cell = st.lists(WORD, min_size=1, max_size=4).map(" ".join)
            rows = draw(st.lists(st.lists(cell, min_size=columns, max_size=columns), min_size=1, max_size=25))
            lines = ["| " + " | ".join(row) + " |" for row in rows]
            lines.insert(1, "|" + "|".join(["---"] * columns) + "|")
            blocks.append("\n".join(lines))
        else:
            blocks.append("```\n" + "\n".join(draw(st.lists(PROSE, min_size=1, max_size=4))) + "\n```")
    return "\n\n".join(blocks)


BUDGETS = st.tuples(st.integers(16, 80), st.integers(0, 11), st.integers(0, 60)).map(
    lambda t: (t[0], min(t[1], t[0] - 1), t[0] + t[2])
)

# The properties are about how a page is cut, at any size: the per-page cap (DOCQUEUE_MAX_CHUNKS_PER_PAGE, 200) has
# tests of its own, and a generated table at a 16-token budget can need more chunks than that.
UNCAPPED = 100_000
PROPERTY_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _table_rows(markdown: str) -> set[str]:
    return {line.strip() for line in markdown.splitlines() if line.strip().startswith("|")}


@PROPERTY_SETTINGS
@given(markdown_pages(), BUDGETS)
def test_chunking_is_deterministic(markdown, budget):
    target, overlap, maximum = budget
    first = chunk_markdown(
        markdown, page_key="k", target_tokens=target, overlap_tokens=overlap, max_tokens=maximum, max_chunks=UNCAPPED
    )
    second = chunk_markdown(
        markdown, page_key="k", target_tokens=target, overlap_tokens=overlap, max_tokens=maximum, max_chunks=UNCAPPED
    )
    assert first == second
    assert all(isinstance(c, Chunk) and c.text.strip() for c in first)
    assert [c.index for c in first] == list(range(len(first)))


def _content(text: str) -> Counter:
    """Characters that carry content: whitespace and table borders are layout the chunker may change."""
    return Counter(char for char in text if not char.isspace() and char not in "|-")


def _words(text: str) -> list[str]:
    return [word for word in re.split(r"[\s|]+", text) if word and not set(word) <= set("-:")]


@PROPERTY_SETTINGS
@given(markdown_pages(), BUDGETS)
def test_every_word_is_kept_and_only_words_in_long_table_cells_are_cut(markdown, budget):
    target, overlap, maximum = budget
    assume("Col" not in markdown)  # synthetic header names are dropped on purpose
    chunks = chunk_markdown(
        markdown, page_key="k", target_tokens=target, overlap_tokens=overlap, max_tokens=maximum, max_chunks=UNCAPPED
    )
    assert not _content(markdown) - _content("".join(c.text for c in chunks)), "text of the input is missing"
    input_words = set(_words(markdown))
    for chunk in chunks:
        for word in _words(chunk.text):
            assert word in input_words or "|" in chunk.text and any(word in whole for whole in input_words), (
                f"{word!r} is neither a word of the input nor a cut of a table cell's word"
            )


@PROPERTY_SETTINGS
@given(markdown_pages(), BUDGETS)
def test_without_overlap_the_words_appear_once_in_order_apart_from_tables(markdown, budget):
    target, _, maximum = budget
    chunks = chunk_markdown(
        markdown, page_key="k", target_tokens=target, overlap_tokens=0, max_tokens=maximum, max_chunks=UNCAPPED
    )
    if not any(line.strip().startswith("|") for line in markdown.splitlines()):
        assert [w for c in chunks for w in words_of(c.text)] == words_of(markdown)


@PROPERTY_SETTINGS
@given(markdown_pages(), BUDGETS)
def test_table_rows_that_fit_half_the_maximum_are_never_cut(markdown, budget):
    target, overlap, maximum = budget
    assume("Col" not in markdown)
    chunks = chunk_markdown(
        markdown, page_key="k", target_tokens=target, overlap_tokens=overlap, max_tokens=maximum, max_chunks=UNCAPPED
    )
    lines = [line.strip() for line in markdown.splitlines()]
    headers = {line for line, following in zip(lines, lines[1:]) if line.startswith("|") and following.startswith("|-")}
    output = {line.strip() for c in chunks for line in c.text.splitlines()}
    for row in _table_rows(markdown) - headers:
        if not row.startswith("|-") and count_tokens(row) <= maximum // 2:
            assert row in output, row


@PROPERTY_SETTINGS
@given(markdown_pages(), BUDGETS)
def test_every_chunk_respects_max_tokens(markdown, budget):
    target, overlap, maximum = budget
    chunks = chunk_markdown(
        markdown, page_key="k", target_tokens=target, overlap_tokens=overlap, max_tokens=maximum, max_chunks=UNCAPPED
    )
    assert all(chunk.token_count <= maximum for chunk in chunks)


def test_a_garbage_run_cannot_become_one_huge_chunk():
    # WordPiece maps a >100-character word to a single [UNK]: without a character bound 50 kB would be "1 token"
    chunks = chunk_markdown("intro text " + "x" * 50_000 + " outro", page_key="doc/p0001")
    assert max(len(c.text) for c in chunks) <= 400 * 101 + 100
    assert "".join(c.text for c in chunks).count("x") >= 50_000
