"""Pure page logic: header/footer learning and removal, OCR reading order, render scaling."""

from __future__ import annotations

import math

import pytest

from processing.ocr_layout import OcrBox, boxes_to_markdown, render_zoom, tesseract_markdown
from processing.page_cleanup import (
    comparable_words,
    edge_lines,
    find_boilerplate,
    is_page_number_line,
    meaningful_chars,
    normalise_line,
    recover_missing_blocks,
    strip_page_furniture,
    tidy_markdown,
    unmapped_share,
)


# -- normalisation and page numbers ------------------------------------------
def test_normalise_line_ignores_markup_case_and_digits():
    assert normalise_line("**Page 3 of 10**") == normalise_line("Page 4 of 10") == "page # of #"
    assert normalise_line("## _ACME_  Corp  Report 2024") == "acme corp report #"
    assert normalise_line("   ") == ""


@pytest.mark.parametrize("line", ["7", "- 7 -", "Page 7", "**12**", "7 / 20", "page 3 of 10", "xii", "(4)", "— 9 —"])
def test_page_number_lines(line):
    assert is_page_number_line(line)


@pytest.mark.parametrize("line", ["7 apples", "Chapter 7", "|7|", "civil", "The end.", "", "2024-05-01", "Figure 3"])
def test_not_page_number_lines(line):
    assert not is_page_number_line(line)


# -- learning boilerplate ------------------------------------------------------
TOPICS = ["apples", "bridges", "comets", "deserts", "engines", "forests", "glaciers", "harbours", "islands", "jungles"]


def _page(number: int, total: int, body: str, header: str = "ACME Corp Annual Report") -> str:
    return f"{header}\n{body}\nmore about {TOPICS[number - 1]} here\nPage {number} of {total}"


def test_find_boilerplate_learns_running_header_and_footer():
    pages = [edge_lines(_page(n, 6, f"Unique body line about {TOPICS[n - 1]}")) for n in range(1, 7)]
    found = find_boilerplate(pages)
    assert "acme corp annual report" in found
    assert "page # of #" in found
    assert not any("unique body" in entry for entry in found)


def test_alternating_running_heads_count():
    pages = []
    for n in range(1, 11):
        head = "Journal of Examples" if n % 2 else "Smith and Jones"
        pages.append(edge_lines(f"{head}\nBody on {TOPICS[n - 1]}\nother {TOPICS[n - 1]} words\n{n}"))
    found = find_boilerplate(pages)
    assert {"journal of examples", "smith and jones"} <= set(found)


def test_too_few_pages_learn_nothing():
    pages = [edge_lines(_page(n, 2, "Body")) for n in (1, 2)]  # the header repeats, but on 2 pages only
    assert find_boilerplate(pages) == []


def test_pages_that_are_one_repeated_line_keep_it():
    pages = [edge_lines("habibi") for _ in range(4)]
    assert find_boilerplate(pages) == []


def test_bare_numbers_are_not_boilerplate_entries():
    pages = [edge_lines(f"Body about {TOPICS[n]}\nand {TOPICS[n]} again\n{n}") for n in range(1, 8)]
    assert find_boilerplate(pages) == []


# -- removing furniture ----------------------------------------------------------
def test_strip_removes_header_footer_and_page_number_at_the_edges_only():
    markdown = (
        "**ACME Corp Annual Report**\n\n# Results\n\nACME Corp Annual Report\n\nRevenue rose.\n\n12\n\nPage 3 of 10\n"
    )
    cleaned = strip_page_furniture(markdown, ["acme corp annual report", "page # of #"])
    assert cleaned == "# Results\n\nACME Corp Annual Report\n\nRevenue rose.\n"


def test_strip_keeps_body_numbers_and_stops_at_first_body_line():
    markdown = "Intro line\n\n1\n\n2\n\nClosing line\n"
    assert strip_page_furniture(markdown, []) == markdown


def test_strip_peels_a_bounded_number_of_lines():
    markdown = "\n".join(str(n) for n in range(1, 21)) + "\n"
    kept = strip_page_furniture(markdown, [])
    assert kept.splitlines() == [str(n) for n in range(7, 15)]


def test_tidy_markdown_spells_out_ligatures_and_blank_lines():
    assert tidy_markdown("o\ufb03ce \ufb01le  \n\n\n\nnext") == "office file\n\nnext\n"
    assert tidy_markdown("\n \n") == ""


def test_comparable_words_match_markdown_and_text_layer_forms():
    assert comparable_words("_Proceedings_ of **com-\npilers** and e\ufb03cient") == [
        "proceedings",
        "of",
        "compilers",
        "and",
        "efficient",
    ]


def test_recover_missing_blocks_appends_only_what_the_converter_dropped():
    markdown = "# Results\n\nSales grew in the north.\n"
    blocks = ["Results", "Sales grew in the north.", "Perceived ease of use", "Sales"]
    recovered = recover_missing_blocks(markdown, blocks)
    assert recovered == "# Results\n\nSales grew in the north.\n\nPerceived ease of use\n\nSales\n"
    assert recover_missing_blocks(markdown, blocks[:2]) == markdown
    assert recover_missing_blocks("", ["rotated line"]) == "rotated line\n"


def test_meaningful_chars_skips_whitespace_and_replacement_chars():
    assert meaningful_chars(" a b\n\ufffd\ufffdc ") == 3


# -- OCR reading order ---------------------------------------------------------------
def _line(x0, y0, x1, text, h=30):
    return OcrBox.from_rect(x0, y0, x1, y0 + h, text)


def test_two_columns_read_column_by_column_after_a_full_width_title():
    boxes = [_line(100, 50, 1500, "A Title Across The Page", h=50)]
    for row in range(4):
        y = 200 + row * 35
        boxes.append(_line(100, y, 760, f"left {row} words words."))
        boxes.append(_line(820, y, 1500, f"right {row} words words."))
    text = boxes_to_markdown(boxes)
    order = [word for word in text.split() if word in {"left", "right"}]
    assert order == ["left"] * 4 + ["right"] * 4
    assert text.startswith("## A Title Across The Page")


def test_lines_of_a_paragraph_are_joined_and_gaps_split_paragraphs():
    boxes = [
        _line(100, 100, 1400, "The first paragraph starts here and"),
        _line(100, 135, 1400, "continues on the second line of text."),
        _line(100, 240, 1400, "A second paragraph after a blank line."),
    ]
    assert boxes_to_markdown(boxes) == (
        "The first paragraph starts here and continues on the second line of text.\n\n"
        "A second paragraph after a blank line.\n"
    )


def test_bullets_become_list_items():
    boxes = [_line(100, 100, 900, "• first item"), _line(100, 135, 900, "• second item")]
    assert boxes_to_markdown(boxes) == "- first item\n\n- second item\n"


def test_skewed_scan_keeps_lines_in_order():
    angle = math.radians(3)
    boxes = []
    for row in range(6):
        x0, y0, x1, y1 = 100, 100 + row * 40, 1500, 130 + row * 40

        def rotate(x, y):
            return (x * math.cos(angle) - y * math.sin(angle), x * math.sin(angle) + y * math.cos(angle))

        quad = (rotate(x0, y0), rotate(x1, y0), rotate(x1, y1), rotate(x0, y1))
        boxes.append(OcrBox(quad, f"line{row} continues"))
    text = boxes_to_markdown(reversed(boxes))
    assert [word for word in text.split() if word.startswith("line")] == [f"line{n}" for n in range(6)]


def test_no_boxes_give_empty_markdown():
    assert boxes_to_markdown([]) == ""
    assert boxes_to_markdown([_line(0, 0, 10, "   ")]) == ""


# -- render scaling ------------------------------------------------------------------
def test_render_zoom_keeps_dpi_for_normal_pages():
    assert render_zoom(612, 792, 200, 25_000_000) == pytest.approx(200 / 72)


def test_render_zoom_scales_posters_down_to_the_pixel_budget():
    zoom = render_zoom(18000, 36000, 200, 25_000_000)
    pixels = (18000 * zoom) * (36000 * zoom)
    assert pixels == pytest.approx(25_000_000, rel=1e-6)
    assert zoom < 200 / 72


def test_a_layer_its_fonts_could_not_map_is_measured_unmapped():
    # glyph ids read as control codes (a font without a ToUnicode map), with a few letters among them
    junk = "5\x03\x04\x05\x03\x06\x04\x07 \t\n \x0b\x0c\x04 @\x04\x0e\x0c\x0f\t\x10 Overview"
    assert meaningful_chars(junk) == len("5@Overview")
    assert unmapped_share(junk) > 0.5
    assert unmapped_share("A page of prose with one \ufffd ligature lost.") < 0.05
    assert unmapped_share("   \n") == 0.0


def test_tesseract_tsv_becomes_its_paragraphs_in_its_order():
    header = "level\tpage_num\tblock_num\tpar_num\tline_num\tword_num\tleft\ttop\twidth\theight\tconf\ttext"

    def word(block: int, par: int, line: int, number: int, text: str) -> str:
        return f"5\t1\t{block}\t{par}\t{line}\t{number}\t0\t0\t10\t10\t95.0\t{text}"

    rows = [
        header,
        "1\t1\t0\t0\t0\t0\t0\t0\t1700\t2200\t-1\t",
        word(1, 1, 1, 1, "Налоговая"),
        word(1, 1, 1, 2, "декла-"),
        word(1, 1, 2, 1, "рация"),
        word(1, 1, 2, 2, "по"),
        word(1, 1, 3, 1, "налогу"),
        word(1, 1, 3, 2, " "),  # an empty word Tesseract reports for a blank box
        word(2, 1, 1, 1, "Second"),
        word(2, 1, 1, 2, "column"),
    ]
    assert tesseract_markdown("\n".join(rows)) == "Налоговая декла-рация по налогу\n\nSecond column\n"
    assert tesseract_markdown(header) == ""
