"""Generate test PDFs with PyMuPDF (plus a tiny raw writer for deliberately broken files).

Every function writes into the given directory and returns the path (`scanned_pdf`
also returns the ground-truth text). Shared by the OCR, storage, vector and graph tests.

`text_pdf` pages are lists of blocks with a small markup:
  "# Title" / "## Section"  -> real headings (larger bold font)
  lines starting "- "       -> a bullet list
  lines starting "|"        -> a table ("|a|b|" rows, first row is the header), drawn with ruling lines
  anything else             -> a paragraph
"""

from __future__ import annotations

import html
import random
import re
import zlib
from collections import Counter
from pathlib import Path

import pymupdf

LETTER = (612, 792)
MARGIN = 72
HEADER_Y = 40
FOOTER_Y = 760
_CSS = "body {font-family: sans-serif; font-size: 11pt;} h1 {font-size: 22pt;} h2 {font-size: 16pt;}"

DEMO_PAGE = [
    "# Quarterly Operations Report",
    "The warehouse in Rotterdam shipped more pallets than in any previous quarter, "
    "while the Lisbon office finished migrating its invoicing to the new ledger.",
    "## Highlights",
    "- Shipments grew by eighteen percent\n- Invoice errors fell below one percent\n- Two new carriers were signed",
    "|Region|Shipments|Returns|\n|North|1200|31|\n|South|950|12|\n|West|780|9|",
    "Management expects the trend to continue through the winter season.",
]

SCANNED_TEXT = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk. "
    "He polished the great lens, trimmed the wick and wrote the weather in a leather journal. "
    "Ships passing the northern reef relied on his steady light through fog and storm. "
    "In winter the island was cut off for weeks, so he kept sacks of flour, "
    "dried fish and lamp oil in the cellar below the kitchen."
)

# Russian prose: RapidOCR's bundled model reads no Cyrillic, Tesseract with `rus` does
CYRILLIC_TEXT = (
    "Смотритель маяка каждый вечер поднимался по винтовой лестнице. "
    "Он протирал большую линзу, подрезал фитиль и записывал погоду в кожаный журнал. "
    "Корабли, проходившие мимо северного рифа, полагались на его ровный свет в туман и шторм. "
    "Зимой остров был отрезан от берега на несколько недель, поэтому в погребе под кухней "
    "он держал мешки муки, сушёную рыбу и масло для лампы."
)

TWO_TOPICS = {
    "beekeeping": [
        "# Keeping Honey Bees",
        "A honey bee colony lives in a hive built from wax combs. The queen lays eggs in hexagonal "
        "cells while worker bees gather nectar and pollen from flowers near the apiary.",
        "Beekeepers inspect the frames every week in spring to check the brood pattern, look for "
        "queen cells and make sure the colony has enough room to store honey.",
        "In late summer the honey supers are removed, the combs are uncapped and the honey is "
        "spun out in an extractor before it is strained and poured into jars.",
    ],
    "volcanoes": [
        "# How Volcanoes Erupt",
        "A volcano forms where molten rock called magma rises through the crust. Pressure from "
        "dissolved gases builds in the magma chamber beneath the summit crater.",
        "When the pressure exceeds the strength of the overlying rock, an eruption sends lava "
        "flows, ash clouds and volcanic bombs down the slopes of the cone.",
        "Geologists monitor seismic tremors, ground deformation and sulfur dioxide emissions to "
        "forecast eruptions and warn the towns built on the fertile volcanic soil.",
    ],
}


# -- well-formed documents -------------------------------------------------
def text_pdf(
    directory: Path,
    name: str,
    pages: list[str | list[str]],
    header: str | None = None,
    footer_page_numbers: bool = True,
) -> Path:
    """A text-layer PDF; each page is one block or a list of blocks (see module doc)."""
    doc = pymupdf.open()
    total = len(pages)
    for number, blocks in enumerate(pages, start=1):
        page = doc.new_page(width=LETTER[0], height=LETTER[1])
        if header:
            page.insert_text((MARGIN, HEADER_Y), header, fontsize=9)
        _write_blocks(page, [blocks] if isinstance(blocks, str) else list(blocks))
        if footer_page_numbers:
            page.insert_text((LETTER[0] / 2 - 30, FOOTER_Y + 12), f"Page {number} of {total}", fontsize=9)
    return _save(doc, directory, name)


def _write_blocks(page: pymupdf.Page, blocks: list[str]) -> None:
    y = MARGIN
    for block in blocks:
        block = block.strip("\n")
        if block.startswith("|"):
            y = _draw_table(page, y, [_cells(row) for row in block.splitlines() if row.strip()])
        else:
            y = _write_html(page, y, _block_html(block))
        y += 6


def _block_html(block: str) -> str:
    if block.startswith("## "):
        return f"<h2>{html.escape(block[3:])}</h2>"
    if block.startswith("# "):
        return f"<h1>{html.escape(block[2:])}</h1>"
    lines = block.splitlines()
    if lines and all(line.startswith("- ") for line in lines):
        return "<ul>" + "".join(f"<li>{html.escape(line[2:])}</li>" for line in lines) + "</ul>"
    return f"<p>{html.escape(' '.join(lines))}</p>"


def _write_html(page: pymupdf.Page, y: float, fragment: str) -> float:
    box = pymupdf.Rect(MARGIN, y, LETTER[0] - MARGIN, FOOTER_Y - 10)
    spare, scale = page.insert_htmlbox(box, fragment, css=_CSS, scale_low=1)
    if spare < 0 or scale < 1:
        raise ValueError("page content does not fit on one page; split it over more pages")
    return y + box.height - spare


def _cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def _draw_table(page: pymupdf.Page, y: float, rows: list[list[str]]) -> float:
    columns = max(len(row) for row in rows)
    width = (LETTER[0] - 2 * MARGIN) / columns
    height = 20
    for r, row in enumerate(rows):
        for c in range(columns):
            cell = pymupdf.Rect(MARGIN + c * width, y + r * height, MARGIN + (c + 1) * width, y + (r + 1) * height)
            page.draw_rect(cell, color=(0, 0, 0), width=0.8)
            text = row[c] if c < len(row) else ""
            font = "hebo" if r == 0 else "helv"
            if page.insert_textbox(cell + (4, 2, -4, 2), text, fontsize=10, fontname=font) < 0:
                raise ValueError(f"table cell text too long: {text!r}")
    return y + len(rows) * height


def wide_table_pdf(
    directory: Path, name: str, rows: list[list[str]], size: tuple[float, float] = (2592, 1728), fontsize: float = 5
) -> Path:
    """One drawing-sheet-sized page (ARCH E1 landscape by default) holding one ruled table: `rows[0]` is the
    header row (empty cells stay empty, so pymupdf4llm names them ColN), each cell as tall as its text needs."""
    doc = pymupdf.open()
    page = doc.new_page(width=size[0], height=size[1])
    columns = max(len(row) for row in rows)
    width = (size[0] - 2 * MARGIN) / columns
    y = MARGIN
    for r, row in enumerate(rows):
        texts = [row[c] if c < len(row) else "" for c in range(columns)]
        lines = max(1, *(len(_wrapped(text, width - 4, fontsize)) for text in texts))
        height = lines * fontsize * 1.5 + 6
        if y + height > size[1] - MARGIN:
            raise ValueError("the table does not fit on one sheet; make it smaller")
        for c, text in enumerate(texts):
            cell = pymupdf.Rect(MARGIN + c * width, y, MARGIN + (c + 1) * width, y + height)
            page.draw_rect(cell, color=(0, 0, 0), width=0.5)
            if page.insert_textbox(cell + (2, 1, -2, 1), text, fontsize=fontsize, fontname="helv") < 0:
                raise ValueError(f"table cell text does not fit: {text[:40]!r}")
        y += height
    return _save(doc, directory, name)


def _wrapped(text: str, width: float, fontsize: float) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        candidate = f"{line} {word}".strip()
        if line and pymupdf.get_text_length(candidate, fontsize=fontsize) > width:
            lines.append(line)
            candidate = word
        line = candidate
    return lines + ([line] if line else [])


def scanned_pdf(directory: Path, name: str, text: str = SCANNED_TEXT, dpi: int = 200) -> tuple[Path, str]:
    """A page holding only a picture of `text` (no text layer); returns (path, text). Text beyond Latin-1 (such as
    CYRILLIC_TEXT) is set in MuPDF's own Times embedded as a Unicode font, which holds Cyrillic and Greek."""
    source = pymupdf.open()
    page = source.new_page(width=LETTER[0], height=LETTER[1])
    fontname = "tiro"
    if any(ord(char) > 0xFF for char in text):
        fontname = "tiro-unicode"
        page.insert_font(fontname=fontname, fontbuffer=pymupdf.Font("tiro").buffer)
    spare = page.insert_textbox(
        pymupdf.Rect(MARGIN, MARGIN, LETTER[0] - MARGIN, LETTER[1] - MARGIN),
        text,
        fontsize=12,
        fontname=fontname,
        lineheight=1.4,
    )
    if spare < 0:
        raise ValueError("text does not fit on one scanned page")
    picture = page.get_pixmap(dpi=dpi, colorspace=pymupdf.csGRAY).tobytes("png")
    source.close()
    doc = pymupdf.open()
    scan = doc.new_page(width=LETTER[0], height=LETTER[1])
    scan.insert_image(scan.rect, stream=picture)
    return _save(doc, directory, name), text


def unmapped_layer_pdf(directory: Path, name: str, text: str = SCANNED_TEXT) -> tuple[Path, str]:
    """A scanned page of `text` under an invisible text layer that reads as a font without a unicode map does:
    glyph ids as control codes, a few letters among them (as pdf.js's TAMReview.pdf reads); returns (path, text)."""
    path, truth = scanned_pdf(directory, name, text)
    doc = pymupdf.open(path)
    junk = "\x03\x04\x05\x06 \x07\x0e\x0f\x10\x11 @\x04\x0e\x0c 5\x05\x06\x11 Overview\n"
    doc[0].insert_text((MARGIN, MARGIN), junk * 12, fontname="helv", fontsize=10, render_mode=3)
    doc.saveIncr()
    doc.close()
    return path, truth


# how an OCR that reads Latin only takes Cyrillic letters: the look-alike each one prints as (a capital where the
# lower-case Cyrillic glyph is a small capital: в к м н т), as issue12963.pdf's earlier OCR reads its Russian form
_LOOKALIKES = {
    **dict(zip("абвгдеёзийклмнопрстуххъь", "a6BrAee3uHKnMHonpcTyxxbb", strict=True)),
    **{"ж": ">K", "ф": "<|>", "ц": "u", "ч": "4", "ш": "w", "щ": "w", "ы": "bl", "э": "3", "ю": "10", "я": "R"},
}


def lookalike_reading(text: str) -> str:
    """`text` (Russian) as a Latin-only OCR reads it: each Cyrillic letter as its Latin look-alike, capitals as
    capitals (`Налоговая декларация` -> `HanoroBaR AeKnapauuR`)."""

    def latin(ch: str) -> str:
        if ch.lower() not in _LOOKALIKES:
            return ch
        reading = _LOOKALIKES[ch.lower()]
        return reading.upper() if ch.isupper() else reading

    return "".join(latin(ch) for ch in text)


def lookalike_layer_pdf(directory: Path, name: str, text: str = CYRILLIC_TEXT) -> tuple[Path, str]:
    """A scanned page of `text` under an invisible text layer of its Latin look-alike reading (`lookalike_reading`),
    an earlier OCR's layer as issue12963.pdf holds it; returns (path, text)."""
    path, truth = scanned_pdf(directory, name, text)
    reading = lookalike_reading(text).split()
    lines = "\n".join(" ".join(reading[i : i + 8]) for i in range(0, len(reading), 8))
    doc = pymupdf.open(path)
    doc[0].insert_text((MARGIN, MARGIN), lines, fontname="helv", fontsize=11, render_mode=3)
    doc.saveIncr()
    doc.close()
    return path, truth


def encrypted_pdf(directory: Path, name: str, password: str) -> Path:
    doc = pymupdf.open()
    page = doc.new_page(width=LETTER[0], height=LETTER[1])
    page.insert_textbox(
        pymupdf.Rect(MARGIN, MARGIN, 540, 300),
        "Confidential salary review for the engineering department. "
        "Only holders of the password may read these figures.",
        fontsize=12,
    )
    path = Path(directory) / name
    doc.save(
        path,
        encryption=pymupdf.PDF_ENCRYPT_AES_256,
        user_pw=password,
        owner_pw=password + "-owner",
        permissions=pymupdf.PDF_PERM_ACCESSIBILITY,
    )
    doc.close()
    return path


def two_topic_pdfs(directory: Path) -> tuple[Path, Path]:
    """Two short documents on unrelated topics (TWO_TOPICS: beekeeping, volcanoes)."""
    paths = [
        text_pdf(directory, f"{topic}.pdf", [blocks], footer_page_numbers=False) for topic, blocks in TWO_TOPICS.items()
    ]
    return paths[0], paths[1]


# -- hostile documents -----------------------------------------------------
def zero_byte_pdf(directory: Path, name: str = "zero.pdf") -> Path:
    path = Path(directory) / name
    path.write_bytes(b"")
    return path


def not_a_pdf(directory: Path, name: str = "not_a_pdf.pdf") -> Path:
    """A PNG image wearing a .pdf name."""
    doc = pymupdf.open()
    doc.new_page(width=100, height=100).insert_text((10, 50), "png", fontsize=20)
    png = doc[0].get_pixmap(dpi=72).tobytes("png")
    path = Path(directory) / name
    path.write_bytes(png)
    return path


def truncated_pdf(directory: Path, name: str = "truncated.pdf", keep: float = 0.55) -> Path:
    """A three-page text PDF cut off part-way (no xref, no trailer)."""
    full = text_pdf(directory, f"full-{name}", [["First page words."], ["Second page words."], ["Third page words."]])
    data = full.read_bytes()
    full.unlink()
    path = Path(directory) / name
    path.write_bytes(data[: int(len(data) * keep)])
    return path


def blank_pages_pdf(directory: Path, n: int, name: str | None = None) -> Path:
    """n empty letter pages (written raw: PyMuPDF's new_page takes seconds for 10,000)."""
    kids = b" ".join(b"%d 0 R" % (3 + i) for i in range(n))
    objects = [b"<</Type/Catalog/Pages 2 0 R>>", b"<</Type/Pages/Kids[" + kids + b"]/Count %d>>" % n]
    objects += [b"<</Type/Page/Parent 2 0 R/MediaBox[0 0 612 792]>>"] * n
    path = Path(directory) / (name or f"blank_{n}.pdf")
    path.write_bytes(raw_pdf(objects))
    return path


def poster_pdf(directory: Path, name: str = "poster.pdf", words: str = "GIANT POSTER") -> Path:
    """An 18000 x 36000 pt page (250 x 500 inches) whose only content is a picture of `words`."""
    source = pymupdf.open()
    page = source.new_page(width=400, height=800)
    page.insert_textbox(pymupdf.Rect(20, 300, 380, 500), words, fontsize=60, fontname="hebo", align=1)
    picture = page.get_pixmap(dpi=72, colorspace=pymupdf.csGRAY).tobytes("png")
    source.close()
    doc = pymupdf.open()
    poster = doc.new_page(width=18000, height=36000)
    poster.insert_image(poster.rect, stream=picture)
    return _save(doc, directory, name)


def huge_image_pdf(directory: Path, name: str = "huge_image.pdf", side: int = 20000) -> Path:
    """A 4-inch page showing one side x side grey image (400 MB decoded, ~0.4 MB stored):
    white with a black square in the middle, so it is not blank but holds no text.
    The page is small so that OCR of it is cheap; decoding the image is the hostile part."""
    compressor = zlib.compressobj(1)
    chunks = []
    third = side // 3
    white = b"\xff" * side
    square = b"\xff" * third + b"\x00" * (side - 2 * third) + b"\xff" * third
    for row in range(side):
        chunks.append(compressor.compress(square if third <= row < side - third else white))
    chunks.append(compressor.flush())
    data = b"".join(chunks)
    doc = pymupdf.open()
    page = doc.new_page(width=288, height=288)
    image = doc.get_new_xref()
    doc.update_object(
        image, f"<</Type/XObject/Subtype/Image/Width {side}/Height {side}/ColorSpace/DeviceGray/BitsPerComponent 8>>"
    )
    doc.update_stream(image, data, compress=False)
    doc.xref_set_key(image, "Filter", "/FlateDecode")
    content = doc.get_new_xref()
    doc.update_object(content, "<<>>")
    doc.update_stream(content, b"q 288 0 0 288 0 0 cm /Im0 Do Q")
    doc.xref_set_key(page.xref, "Resources", f"<</XObject<</Im0 {image} 0 R>>>>")
    doc.xref_set_key(page.xref, "Contents", f"{content} 0 R")
    return _save(doc, directory, name, garbage=0)


def nested_objects_pdf(directory: Path, name: str = "nested.pdf", depth: int = 200_000) -> Path:
    """A page whose resources hold an array nested `depth` levels deep (parser recursion bomb)."""
    nested = b"[" * depth + b"1" + b"]" * depth
    content = b"BT /F1 12 Tf 72 700 Td (Nested objects page) Tj ET"
    objects = [
        b"<</Type/Catalog/Pages 2 0 R>>",
        b"<</Type/Pages/Kids[3 0 R]/Count 1>>",
        b"<</Type/Page/Parent 2 0 R/MediaBox[0 0 612 792]/Contents 4 0 R"
        b"/Resources<</Font<</F1 5 0 R>>/Deep " + nested + b">>>>",
        b"<</Length %d>>stream\n" % len(content) + content + b"\nendstream",
        b"<</Type/Font/Subtype/Type1/BaseFont/Helvetica>>",
    ]
    path = Path(directory) / name
    path.write_bytes(raw_pdf(objects))
    return path


def broken_page_tree_pdf(directory: Path, name: str, sources: list[Path], flaw: str = "count") -> Path:
    """The pages of `sources`, in order, in a PDF whose page tree PyMuPDF cannot read but pdfium can (see
    `break_page_tree`)."""
    doc = pymupdf.open()
    for source in sources:
        with pymupdf.open(source) as part:
            doc.insert_pdf(part)
    return break_page_tree(_save(doc, directory, name), flaw)


def break_page_tree(path: Path, flaw: str = "count") -> Path:
    """Break the page tree of the PDF at `path`, in place, so that PyMuPDF finds no pages and pdfium still does.

    `flaw` "count": the page tree's /Count says 0 over its real kids (MuPDF trusts /Count; pdfium counts the
    kids). "root": the catalog's /Pages names the first page instead of a page tree (MuPDF finds no page tree;
    pdfium reads that one page). The object is patched in the bytes and the xref table written again, so neither
    engine needs to repair the file."""
    with pymupdf.open(path) as doc:
        catalog = doc.pdf_catalog()
        tree = int(doc.xref_get_key(catalog, "Pages")[1].split()[0])
        first_page = doc[0].xref
    data = path.read_bytes()
    if flaw == "count":
        data = _patched_object(data, tree, rb"/Count\s*\d+", b"/Count 0")
    elif flaw == "root":
        data = _patched_object(data, catalog, rb"/Pages\s+\d+\s+0\s+R", b"/Pages %d 0 R" % first_page)
    else:
        raise ValueError(f"unknown page tree flaw {flaw!r} (use count or root)")
    path.write_bytes(data)
    return path


def _patched_object(data: bytes, xref: int, pattern: bytes, replacement: bytes) -> bytes:
    start = data.index(b"\n%d 0 obj" % xref)
    end = data.index(b"endobj", start)
    body, found = re.subn(pattern, replacement, data[start:end], count=1)
    if not found:
        raise ValueError(f"object {xref} has nothing matching {pattern!r}")
    return _with_fresh_xref(data[:start] + body + data[end:])


def _with_fresh_xref(data: bytes) -> bytes:
    """The classic xref table PyMuPDF writes, with every object's offset taken again after a patch moved them."""
    table = data.rindex(b"\nxref\n") + 1
    trailer = data.index(b"trailer", table)
    offsets = {int(m[1]): m.start(1) for m in re.finditer(rb"(?m)^(\d+) 0 obj\b", data[:table])}
    rows = [
        b"%010d 00000 n \n" % offsets[n] if n in offsets else b"0000000000 65535 f \n"
        for n in range(1, max(offsets) + 1)
    ]
    return (
        data[:table]
        + b"xref\n0 %d\n0000000000 65535 f \n" % (max(offsets) + 1)
        + b"".join(rows)
        + data[trailer : data.index(b"startxref", trailer)]
        + b"startxref\n%d\n%%%%EOF\n" % table
    )


def unreadable_pdf(directory: Path, name: str = "unreadable.pdf") -> Path:
    """A PDF header followed by noise: no engine finds an object in it."""
    path = Path(directory) / name
    path.write_bytes(b"%PDF-1.7\n" + random.Random(3).randbytes(3000))
    return path


def raw_pdf(objects: list[bytes]) -> bytes:
    """Serialise objects 1..n (object 1 is the catalog) with a correct xref table."""
    out = bytearray(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref_at = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for offset in offsets:
        out += b"%010d 00000 n \n" % offset
    out += b"trailer\n<</Size %d/Root 1 0 R>>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref_at)
    return bytes(out)


def _save(doc: pymupdf.Document, directory: Path, name: str, garbage: int = 1) -> Path:
    path = Path(directory) / name
    doc.save(path, garbage=garbage, deflate=True)
    doc.close()
    return path


def words(text: str) -> list[str]:
    return re.findall(r"[^\W_]+", text.lower())  # '_' is markdown emphasis


def word_recall(truth: str, got: str) -> float:
    """Share of the ground-truth words (with multiplicity) found in `got`."""
    expected, found = Counter(words(truth)), Counter(words(got))
    total = sum(expected.values())
    return sum(min(count, found[word]) for word, count in expected.items()) / total if total else 1.0
