"""The demo's sample set, generated with PyMuPDF: two text documents, one scanned (image-only) page and one
broken file. Made on the fly so the project ships no binary fixtures."""

from __future__ import annotations

from pathlib import Path

from resources.pymupdf_loader import pymupdf

TEXT_DOCUMENTS = {
    "harbour-report.pdf": [
        [
            "# Harbour Operations Report",
            "The Port of Rotterdam handled more containers this quarter than ever before. Maria Jansen, the harbour "
            "master, credited the new automated cranes supplied by Konecranes.",
            "## Highlights",
            "- Container volume grew by eighteen percent\n- Vessel waiting time fell to nine hours\n"
            "- Two new shipping lines called at the Maasvlakte terminal",
        ],
        [
            "## Outlook",
            "Maria Jansen expects Maersk and CMA CGM to expand their services to Rotterdam next year. "
            "The city council of Rotterdam approved a new rail link to Germany.",
            "Dredging of the main channel will continue through the winter season.",
        ],
    ],
    "volcano-notes.pdf": [
        [
            "# Notes on Mount Etna",
            "Mount Etna in Sicily is one of the most active volcanoes in Europe. The Italian National Institute of "
            "Geophysics and Volcanology monitors its summit craters day and night.",
            "Lava fountains from the southeast crater reached heights of one kilometre during the spring eruptions, "
            "and ash closed Catania airport for two days.",
        ]
    ],
}

SCANNED_TEXT = (
    "The lighthouse keeper on the island of Texel climbed the spiral stairs every evening. "
    "He polished the great lens and wrote the weather in a leather journal."
)


def _text_document(path: Path, pages: list[list[str]]) -> None:
    doc = pymupdf.open()
    for number, blocks in enumerate(pages, start=1):
        page = doc.new_page(width=612, height=792)
        html = "".join(_block(b) for b in blocks)
        page.insert_htmlbox(
            pymupdf.Rect(72, 72, 540, 720), html, css="body {font-family: sans-serif; font-size: 11pt;}"
        )
        page.insert_text((72, 770), f"Page {number}", fontsize=8)
    doc.save(path)
    doc.close()


def _block(block: str) -> str:
    if block.startswith("## "):
        return f"<h2>{block[3:]}</h2>"
    if block.startswith("# "):
        return f"<h1>{block[2:]}</h1>"
    if block.startswith("- "):
        return "<ul>" + "".join(f"<li>{line[2:]}</li>" for line in block.splitlines()) + "</ul>"
    return f"<p>{block}</p>"


def _scanned_page(path: Path, text: str) -> None:
    # render the text, then keep only the picture: the page has no text layer, so it must go through OCR
    source = pymupdf.open()
    page = source.new_page(width=612, height=300)
    page.insert_textbox(pymupdf.Rect(36, 36, 576, 280), text, fontsize=16, fontname="helv")
    pixmap = page.get_pixmap(dpi=200)
    source.close()
    scanned = pymupdf.open()
    scanned_page = scanned.new_page(width=612, height=300)
    scanned_page.insert_image(scanned_page.rect, stream=pixmap.tobytes("png"))
    scanned.save(path)
    scanned.close()


def _broken(path: Path) -> None:
    doc = pymupdf.open()
    doc.new_page().insert_text((72, 72), "This file will be cut in half.")
    data = doc.tobytes()
    doc.close()
    path.write_bytes(data[: len(data) // 3])


def write_samples(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, pages in TEXT_DOCUMENTS.items():
        _text_document(directory / name, pages)
        paths.append(directory / name)
    _scanned_page(directory / "scanned-logbook.pdf", SCANNED_TEXT)
    _broken(directory / "broken-upload.pdf")
    return paths + [directory / "scanned-logbook.pdf", directory / "broken-upload.pdf"]
