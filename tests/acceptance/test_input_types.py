"""Every input type through the pipeline: images are OCRed, EPUB and XPS laid out by PyMuPDF, text, Markdown and
HTML become page markdown without OCR. The type comes from the content (a PNG named .pdf is an image) and
anything else is refused at intake with what it looks like."""

from __future__ import annotations

import io
import random
import re
import zipfile
from pathlib import Path

import pymupdf
import pytest

from queue_db.phases import Level

IMAGE_TEXTS = {
    "scan.png": "The harbour master counted seven fishing boats returning before the storm reached the coast.",
    "photo.jpg": "Our bakery sells rye bread, almond cakes and cinnamon rolls every morning except Sunday.",
    "fax.tiff": [
        "The quarterly invoice lists twelve pallets of ceramic tiles shipped to Rotterdam.",
        "Payment is due within thirty days of delivery to the warehouse in Antwerp.",
    ],
    "disguised.pdf": "Volunteers planted four hundred oak saplings along the river embankment in April.",
}
EPUB_CHAPTERS = [
    ("Chapter One", "The lighthouse keeper polished the great lens every evening."),
    ("Chapter Two", "Ships passing the northern reef relied on his steady light."),
]
XPS_LINE = "The glass factory exported optical lenses to Copenhagen."
TEXT_PARAGRAPHS = [
    f"Paragraph {n} of the field notes: the survey team measured soil moisture at station {n} "
    f"and recorded the readings in the logbook before noon."
    for n in range(1, 9)
]
MARKDOWN = (
    "# Beekeeping Notes\n\nA colony lives in a hive built from wax combs.\n\n"
    "- Inspect frames weekly\n- Look for queen cells\n\nSee [the guide](https://example.org/bees) for more."
)
HTML = (
    "<!DOCTYPE html><html><head><title>ignored</title><style>p { color: red }</style>"
    "<script>document.write('<p>never shown</p>')</script></head><body>"
    "<h1>Volcano Report</h1><p>Magma rises through the <b>crust</b> &amp; builds pressure.</p>"
    "<ul><li>Lava flows</li><li>Ash clouds</li></ul>"
    "<p>Read the <a href='https://example.org'>observatory bulletin</a> daily.</p></body></html>"
)
HTML_MARKDOWN = (
    "# Volcano Report\n\nMagma rises through the crust & builds pressure.\n\n- Lava flows\n- Ash clouds"
    "\n\nRead the observatory bulletin daily."
)
TEXT_PAGE_CHARS = 400


# -- generated inputs -------------------------------------------------------------------------------------------
def _text_image(text: str) -> pymupdf.Pixmap:
    doc = pymupdf.open()
    page = doc.new_page(width=460, height=160)
    page.insert_textbox(pymupdf.Rect(20, 20, 440, 150), text, fontsize=15, fontname="helv")
    return page.get_pixmap(dpi=150)


def _tiff(path: Path, texts: list[str]) -> Path:
    from PIL import Image

    frames = [Image.open(io.BytesIO(_text_image(t).tobytes("png"))).convert("RGB") for t in texts]
    frames[0].save(path, format="TIFF", save_all=True, append_images=frames[1:], compression="tiff_deflate")
    return path


def _epub(path: Path) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(zipfile.ZipInfo("mimetype"), "application/epub+zip", compress_type=zipfile.ZIP_STORED)
        z.writestr(
            "META-INF/container.xml",
            '<?xml version="1.0"?><container version="1.0" '
            'xmlns="urn:oasis:names:tc:opendocument:xmlns:container"><rootfiles>'
            '<rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/>'
            "</rootfiles></container>",
        )
        items = "".join(
            f'<item id="c{i}" href="c{i}.xhtml" media-type="application/xhtml+xml"/>' for i in range(len(EPUB_CHAPTERS))
        )
        spine = "".join(f'<itemref idref="c{i}"/>' for i in range(len(EPUB_CHAPTERS)))
        z.writestr(
            "OEBPS/content.opf",
            '<?xml version="1.0" encoding="UTF-8"?><package xmlns="http://www.idpf.org/2007/opf" '
            'version="3.0" unique-identifier="id"><metadata xmlns:dc="http://purl.org/dc/elements/1.1/">'
            '<dc:identifier id="id">urn:uuid:docqueue-test</dc:identifier><dc:title>Keeper</dc:title>'
            f"<dc:language>en</dc:language></metadata><manifest>{items}</manifest><spine>{spine}</spine>"
            "</package>",
        )
        for i, (title, body) in enumerate(EPUB_CHAPTERS):
            z.writestr(
                f"OEBPS/c{i}.xhtml",
                '<?xml version="1.0" encoding="UTF-8"?><html xmlns="http://www.w3.org/1999/xhtml"><head>'
                f"<title>{title}</title></head><body><h1>{title}</h1><p>{body}</p></body></html>",
            )
    return path


def _xps(path: Path) -> Path:
    """A one-page XPS with one line of Glyphs in PyMuPDF's built-in Helvetica (MuPDF reads CFF fonts in XPS)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(
            "[Content_Types].xml",
            '<?xml version="1.0" encoding="utf-8"?>'
            '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
            '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
            '<Default Extension="fdseq" ContentType="application/vnd.ms-package.xps-fixeddocumentsequence+xml"/>'
            '<Default Extension="fdoc" ContentType="application/vnd.ms-package.xps-fixeddocument+xml"/>'
            '<Default Extension="fpage" ContentType="application/vnd.ms-package.xps-fixedpage+xml"/>'
            '<Default Extension="otf" ContentType="application/vnd.ms-opentype"/></Types>',
        )
        z.writestr(
            "_rels/.rels",
            '<?xml version="1.0" encoding="utf-8"?>'
            '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
            '<Relationship Type="http://schemas.microsoft.com/xps/2005/06/fixedrepresentation" '
            'Target="/FixedDocumentSequence.fdseq" Id="R0"/></Relationships>',
        )
        z.writestr(
            "FixedDocumentSequence.fdseq",
            '<FixedDocumentSequence xmlns="http://schemas.microsoft.com/xps/2005/06">'
            '<DocumentReference Source="/Documents/1/FixedDocument.fdoc"/></FixedDocumentSequence>',
        )
        z.writestr(
            "Documents/1/FixedDocument.fdoc",
            '<FixedDocument xmlns="http://schemas.microsoft.com/xps/2005/06">'
            '<PageContent Source="/Documents/1/Pages/1.fpage"/></FixedDocument>',
        )
        z.writestr("Resources/helv.otf", pymupdf.Font("helv").buffer)
        z.writestr(
            "Documents/1/Pages/1.fpage",
            '<FixedPage xmlns="http://schemas.microsoft.com/xps/2005/06" Width="816" Height="1056" '
            'xml:lang="en-US"><Glyphs Fill="#ff000000" FontUri="/Resources/helv.otf" '
            f'FontRenderingEmSize="16" OriginX="96" OriginY="120" UnicodeString="{XPS_LINE}"/></FixedPage>',
        )
    return path


def _supported_inputs(folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "scan.png": folder / "scan.png",
        "photo.jpg": folder / "photo.jpg",
        "fax.tiff": folder / "fax.tiff",
        "disguised.pdf": folder / "disguised.pdf",
    }
    _text_image(IMAGE_TEXTS["scan.png"]).save(files["scan.png"])
    _text_image(IMAGE_TEXTS["photo.jpg"]).save(files["photo.jpg"], jpg_quality=85)
    _tiff(files["fax.tiff"], IMAGE_TEXTS["fax.tiff"])
    _text_image(IMAGE_TEXTS["disguised.pdf"]).save(files["disguised.pdf"], output="png")  # a PNG named .pdf
    files["book.epub"] = _epub(folder / "book.epub")
    files["form.xps"] = _xps(folder / "form.xps")
    files["notes.txt"] = folder / "notes.txt"
    # Windows line ends and a run of blank lines: both normalised, nothing else changes
    files["notes.txt"].write_bytes("\r\n\r\n\r\n".join(TEXT_PARAGRAPHS).encode())
    files["readme.md"] = folder / "readme.md"
    files["readme.md"].write_text(MARKDOWN, encoding="utf-8")
    files["page.html"] = folder / "page.html"
    files["page.html"].write_text(HTML, encoding="utf-8")
    return files


def _unsupported_inputs(folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    program = folder / "program.pdf"  # the name lies: an ELF header
    program.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(56) + random.Random(1).randbytes(2000))
    noise = folder / "noise.txt"
    noise.write_bytes(random.Random(7).randbytes(4096))
    archive = folder / "archive.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("inner.txt", "an archive is not a document")
    return {"program.pdf": program, "noise.txt": noise, "archive.zip": archive}


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def _recall(expected: str, found: str) -> float:
    wanted, seen = _words(expected), set(_words(found))
    return sum(1 for w in wanted if w in seen) / len(wanted)


# -- tests ---------------------------------------------------------------------------------------------------------
def test_unsupported_content_is_refused_at_intake_with_its_type(queue, tmp_path, monkeypatch):
    from orchestration.intake import IntakeRules, ingest_paths
    from queue_db.config import Settings
    from resources.storage import LocalStorage

    monkeypatch.setenv("DOCQUEUE_MAX_TEXT_MB", "0.001")  # about 1 KB: the long text below is refused
    files = _unsupported_inputs(tmp_path / "in")
    big = tmp_path / "in" / "big.txt"
    big.write_text("words " * 400, encoding="utf-8")
    rules = IntakeRules.from_settings(Settings.from_env())
    results = {
        Path(r.path).name: r
        for r in ingest_paths(queue, LocalStorage(tmp_path / "store"), [tmp_path / "in"], rules=rules)
    }

    assert {name: r.status for name, r in results.items()} == dict.fromkeys([*files, "big.txt"], "rejected")
    assert (
        results["program.pdf"].reason == "unsupported: an executable program (ELF) (detected: application/x-executable)"
    )
    assert results["noise.txt"].reason == "unsupported: unrecognised binary data (detected: application/octet-stream)"
    assert (
        results["archive.zip"].reason
        == "unsupported: a ZIP archive that is not a document (EPUB, XPS, DOCX or XLSX) (detected: application/zip)"
    )
    assert results["big.txt"].reason.startswith("too large: text of more than")
    with queue.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM documents").scalar() == 0
    assert not list((tmp_path / "store").rglob("*.*"))  # nothing stored either


@pytest.fixture
def pipeline_env(docqueue_env, tmp_path, monkeypatch):
    monkeypatch.setenv("DOCQUEUE_TEXT_PAGE_CHARS", str(TEXT_PAGE_CHARS))
    from orchestration.code_location import build_definitions
    from queue_db.config import Settings as _Settings

    # built here, with this test's environment: the resources carry its home and stores
    defs = build_definitions(_Settings.from_env())
    from orchestration.environment import dagster_instance
    from queue_db.config import Settings
    from resources.database import open_queue
    from resources.storage_resource import StorageResource

    instance = dagster_instance(Settings.from_env())
    queue = open_queue(Settings.from_env())
    storage = StorageResource.from_settings(Settings.from_env()).get_storage()
    yield defs, instance, queue, storage, tmp_path
    instance.dispose()


def test_every_input_type_goes_through_the_pipeline(pipeline_env):
    from orchestration.intake import IntakeRules, ingest_paths
    from orchestration.partitions import register_partitions
    from orchestration.runner import run_until_idle
    from queue_db.config import Settings

    defs, instance, queue, storage, tmp = pipeline_env
    files = _supported_inputs(tmp / "in")
    rules = IntakeRules.from_settings(Settings.from_env())
    results = {Path(r.path).name: r for r in ingest_paths(queue, storage, [tmp / "in"], rules=rules)}
    assert {n: r.status for n, r in results.items()} == dict.fromkeys(files, "new"), {
        n: r.reason for n, r in results.items()
    }
    register_partitions(instance, queue.engine, Level.DOCUMENT)
    documents = {name: queue.document(r.document_id) for name, r in results.items()}
    assert {n: d["mime_type"] for n, d in documents.items()} == {
        "scan.png": "image/png",
        "photo.jpg": "image/jpeg",
        "fax.tiff": "image/tiff",
        "disguised.pdf": "image/png",
        "book.epub": "application/epub+zip",
        "form.xps": "application/vnd.ms-xpsdocument",
        "notes.txt": "text/plain",
        "readme.md": "text/markdown",
        "page.html": "text/html",
    }
    assert documents["disguised.pdf"]["filename"] == "disguised.pdf"

    run_until_idle(defs, instance, queue, settings=Settings.from_env(), until_idle=True, max_seconds=300)

    pages: dict[str, list[tuple[str, str]]] = {}
    for name, document in documents.items():
        document = queue.document(str(document["id"]))
        assert (document["ocr_status"], document["vector_index_status"], document["graphrag_index_status"]) == (
            "completed",
            "completed",
            "completed",
        ), (name, document["ocr_error"])
        pages[name] = [(p["ocr_method"], storage.get_text(p["page_file_path"])) for p in queue.pages(document["id"])]

    methods = {name: [m for m, _ in page_list] for name, page_list in pages.items()}
    expected_text_pages = -(-len("\n\n".join(TEXT_PARAGRAPHS)) // TEXT_PAGE_CHARS)
    assert methods == {
        "scan.png": ["ocr:rapidocr"],
        "photo.jpg": ["ocr:rapidocr"],
        "fax.tiff": ["ocr:rapidocr"] * 2,
        "disguised.pdf": ["ocr:rapidocr"],
        "book.epub": ["text-layer"] * len(EPUB_CHAPTERS),
        "form.xps": ["text-layer"],
        "notes.txt": ["text"] * len(methods["notes.txt"]),
        "readme.md": ["text"],
        "page.html": ["html"],
    }
    assert len(methods["notes.txt"]) >= expected_text_pages > 1

    recalls = {}
    for name in ("scan.png", "photo.jpg", "disguised.pdf"):
        recalls[name] = _recall(IMAGE_TEXTS[name], pages[name][0][1])
    for frame, text in enumerate(IMAGE_TEXTS["fax.tiff"]):
        recalls[f"fax.tiff#{frame + 1}"] = _recall(text, pages["fax.tiff"][frame][1])
    print("OCR word recall:", {k: round(v, 3) for k, v in recalls.items()})
    assert min(recalls.values()) >= 0.9, recalls

    for (title, body), (_, markdown) in zip(EPUB_CHAPTERS, pages["book.epub"]):
        assert title in markdown and body in markdown
    assert XPS_LINE in pages["form.xps"][0][1]

    text_pages = [markdown for _, markdown in pages["notes.txt"]]
    assert all(len(p) <= TEXT_PAGE_CHARS for p in text_pages)
    assert all(p.startswith("Paragraph ") for p in text_pages)  # split at paragraph boundaries
    assert "\n\n".join(text_pages) == "\n\n".join(TEXT_PARAGRAPHS)
    assert pages["readme.md"][0][1] == MARKDOWN
    assert pages["page.html"][0][1] == HTML_MARKDOWN
