"""Pure logic of the input types and the object-store cursor: content detection, HTML to markdown, the split of
text into pages, and which objects a cursor still has to take."""

from __future__ import annotations

import codecs
import io
import zipfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestration.s3_intake import IntakeCursor, S3Object, pending_objects
from processing.content_types import detect_type, rejection_reason
from processing.text_pages import UnreadableMarkup, decode_text, html_to_markdown, split_pages


# -- detection -----------------------------------------------------------------------------------------------------
def _zip(entries: dict[str, bytes], stored_first: str | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        if stored_first:
            z.writestr(zipfile.ZipInfo(stored_first), entries.pop(stored_first), compress_type=zipfile.ZIP_STORED)
        for name, data in entries.items():
            z.writestr(name, data)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "head, expected",
    [
        (b"%PDF-1.7\n%\xe2\xe3", "application/pdf"),
        (b"garbage before the header %PDF-1.4", "application/pdf"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "image/png"),
        (b"\xff\xd8\xff\xe0\x00\x10JFIF", "image/jpeg"),
        (b"II*\x00\x08\x00", "image/tiff"),
        (b"MM\x00*\x00\x00", "image/tiff"),
        (b"\x7fELF\x02\x01\x01" + bytes(50), "application/x-executable"),
        (b"MZ\x90\x00\x03" + bytes(50), "application/vnd.microsoft.portable-executable"),
        (b"\x1f\x8b\x08\x00" + bytes(20), "application/gzip"),
        (b"GIF89a\x01\x00", "image/gif"),
        (bytes(range(256)) * 4, "application/octet-stream"),
        (b"Just a plain note.\nSecond line.\n", "text/plain"),
        ("Caf\u00e9 cr\u00e8me and na\u00efve r\u00e9sum\u00e9.".encode("cp1252"), "text/plain"),
        (codecs.BOM_UTF8 + b"Plain text with a byte-order mark.", "text/plain"),
        (codecs.BOM_UTF16_LE + "A UTF-16 note.".encode("utf-16-le"), "text/plain"),
        (b"# Title\n\nSome words.\n", "text/markdown"),
        (b"Notes\n\n- one item\n- see [docs](https://example.org)\n", "text/markdown"),
        (b"  <!DOCTYPE html><html><body><p>x</p></body></html>", "text/html"),
        (b"<?xml version='1.0'?><html xmlns='http://www.w3.org/1999/xhtml'><body/></html>", "text/html"),
        (b"<div><p>a fragment</p></div>", "text/html"),
        (b"<?xml version='1.0'?><catalog><item>1</item></catalog>", "application/xml"),
        (b"<svg xmlns='http://www.w3.org/2000/svg'></svg>", "image/svg+xml"),
    ],
)
def test_type_comes_from_the_content(head, expected):
    assert detect_type(head) == expected


def test_a_utf8_character_cut_by_the_head_is_still_text():
    text = ("\u00e9t\u00e9 " * 600).encode()
    assert detect_type(text[:2047]) == "text/plain"


def _content_types(main: str) -> bytes:
    return (
        '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types"><Override '
        f'PartName="/main.xml" ContentType="application/vnd.openxmlformats-officedocument.{main}.main+xml"/>'
        "</Types>"
    ).encode()


def test_zips_are_told_apart_by_their_directory(tmp_path):
    epub = _zip({"mimetype": b"application/epub+zip", "META-INF/container.xml": b"<container/>"}, "mimetype")
    xps = _zip({"[Content_Types].xml": b"<Types/>", "FixedDocumentSequence.fdseq": b"<x/>"})
    docx = _zip({"[Content_Types].xml": _content_types("wordprocessingml.document"), "word/document.xml": b"<w/>"})
    xlsx = _zip({"[Content_Types].xml": _content_types("spreadsheetml.sheet"), "xl/workbook.xml": b"<w/>"})
    pptx = _zip({"[Content_Types].xml": _content_types("presentationml.presentation"), "ppt/p.xml": b"<p/>"})
    odt = _zip({"mimetype": b"application/vnd.oasis.opendocument.text"}, "mimetype")
    plain = _zip({"a.txt": b"hello"})
    expected = {
        "epub": "application/epub+zip",
        "xps": "application/vnd.ms-xpsdocument",
        "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        "xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        "pptx": "application/vnd.openxmlformats-officedocument",
        "odt": "application/vnd.oasis.opendocument.text",
        "plain": "application/zip",
    }
    for name, data in {
        "epub": epub,
        "xps": xps,
        "docx": docx,
        "xlsx": xlsx,
        "pptx": pptx,
        "odt": odt,
        "plain": plain,
    }.items():
        path = tmp_path / f"{name}.bin"
        path.write_bytes(data)
        assert detect_type(data[:2048], path) == expected[name], name
    assert detect_type(epub[:2048]) == "application/epub+zip"  # without the file: the stored first entry
    broken = tmp_path / "broken.zip"
    broken.write_bytes(b"PK\x03\x04" + bytes(100))
    assert detect_type(broken.read_bytes(), broken) == "application/zip"


def test_rejections_name_what_the_content_is():
    assert rejection_reason("image/png") is None and rejection_reason("text/html") is None
    assert (
        rejection_reason("application/zip")
        == "unsupported: a ZIP archive that is not a document (EPUB, XPS, DOCX or XLSX) (detected: application/zip)"
    )
    assert rejection_reason("application/vnd.oasis.opendocument.text").startswith("unsupported: an OpenDocument file")
    assert (
        rejection_reason("application/x-whatever")
        == "unsupported: a file type docqueue does not read (detected: application/x-whatever)"
    )


def test_delimited_tables_are_csv_and_prose_with_commas_is_not():
    tables = {
        "comma": "name,age,city\nann,3,paris\nbob,4,rome\n",
        "semicolon": "a;b\n1;2\n3;4",
        "tab": "k\tv\nx\t1\n",
        "quoted": 'id,note\n1,"hello, world"\n2,"multi\nline"\n3,x\n',
        "ragged": "a,b,c\n1,2,3\n4,5\n6,7,8\n9,10,11\n12,13,14,15\n",
    }
    for name, text in tables.items():
        assert detect_type(text.encode()) == "text/csv", name
    prose = {
        "paragraphs": "Hello, world.\n\nAnother, paragraph, here.\n",
        "verse": "Roses are red, violets are blue\nSugar is sweet, and so are you\n",
        "one line": "one line, with commas, only\n",
        "uneven": "a, b\nno commas here\nc, d, e, f\nplain\n",
    }
    for name, text in prose.items():
        assert detect_type(text.encode()) == "text/plain", name


# -- HTML ----------------------------------------------------------------------------------------------------------
def test_html_becomes_markdown_without_scripts_or_styles():
    html = (
        "<html><head><title>t</title><style>h1{}</style></head><body>"
        "<script>var s = '<h1>no</h1>';</script><noscript>enable js</noscript>"
        "<h2>Section  A</h2><p>One <em>two</em>\n three &amp; <a href='/x'>four</a>.<br>Five.</p>"
        "<ol><li>first</li><li>second<ul><li>inner</li></ul></li></ol>"
        "<table><tr><th>k</th><th>v</th></tr><tr><td>a|b</td><td>1</td></tr></table>"
        "<pre>  keep\n    spacing</pre><blockquote><p>quoted</p></blockquote></body></html>"
    )
    assert html_to_markdown(html) == (
        "## Section A\n\nOne two three & four.\nFive.\n\n1. first\n2. second\n   - inner\n\n"
        "| k    | v |\n| ---- | --- |\n| a\\|b | 1 |\n\n```\n  keep\n    spacing\n```\n> quoted"
    )


def test_html_with_unclosed_tags_keeps_its_text():
    assert html_to_markdown("<head><title>x</title><body><p>one<p>two<li>three") == "one\n\ntwo\n\n- three"


def test_html_too_deep_to_read_whole_is_refused_not_truncated():
    deep = "<p>before</p>" + "<div>" * 2000 + "deep text" + "</div>" * 2000
    with pytest.raises(UnreadableMarkup, match="cannot be read whole"):
        html_to_markdown(deep)
    assert "deep text" in html_to_markdown("<div>" * 500 + "deep text" + "</div>" * 500)


def test_html_charset_comes_from_its_meta_tag():
    data = '<html><head><meta charset="iso-8859-1"></head><body><p>Gr\u00fc\u00dfe</p></body></html>'.encode("latin-1")
    assert "Gr\u00fc\u00dfe" in html_to_markdown(decode_text(data, html=True))


# -- pages ---------------------------------------------------------------------------------------------------------
def test_pages_break_at_paragraphs_and_stay_within_the_limit():
    paragraphs = [f"Paragraph {n} " + "word " * 30 for n in range(10)]
    pages = split_pages("\n\n".join(p.strip() for p in paragraphs), 400)
    assert len(pages) > 1 and all(len(p) <= 400 for p in pages)
    assert all(p.startswith("Paragraph") for p in pages)
    assert "\n\n".join(pages) == "\n\n".join(p.strip() for p in paragraphs)


def test_blank_text_has_no_pages():
    assert split_pages("  \n\n \t\n", 1000) == []


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab cd\n\t.é"), max_size=3000), st.integers(200, 900))
def test_pages_never_exceed_the_limit_and_keep_every_word(text, limit):
    pages = split_pages(text, limit)
    assert all(0 < len(p) <= limit for p in pages)
    assert "".join("".join(pages).split()) == "".join(text.split())


# -- the object-store cursor ---------------------------------------------------------------------------------------
def _objects(keys: str, when: float, etag: str = "e1") -> list[S3Object]:
    return [S3Object(f"in/{k}", etag, 10, when) for k in keys]


def _take(objects, cursor, n, lookback=900.0) -> list[str]:
    taken = pending_objects(objects, cursor, lookback)[:n]
    for obj in taken:
        cursor.mark(obj)
    return [o.key.rsplit("/", 1)[1] for o in taken]


def test_a_cursor_resumes_inside_a_run_of_equal_timestamps():
    bucket = _objects("abcde", 1000.0)
    cursor = IntakeCursor()
    assert [_take(bucket, cursor, 2) for _ in range(4)] == [["a", "b"], ["c", "d"], ["e"], []]
    # listed later with the same LastModified but a smaller key: a (timestamp, last key) cursor would skip it
    bucket += _objects("0", 1000.0)
    assert _take(bucket, cursor, 2) == ["0"]


def test_a_cursor_takes_changed_objects_and_late_arrivals_within_the_look_back():
    cursor = IntakeCursor()
    bucket = _objects("ab", 1000.0)
    _take(bucket, cursor, 10)
    bucket = [S3Object("in/a", "e2", 12, 1500.0), bucket[1]]  # overwritten
    assert _take(bucket, cursor, 10) == ["a"]
    late = _objects("x", 1500.0 - 600)  # an upload stamped when it started, visible only now
    ancient = _objects("y", 1500.0 - 5000)
    assert _take(bucket + late + ancient, cursor, 10) == ["x"]
    cursor.prune(900.0, {"in/a", "in/x"})
    assert set(cursor.handled) == {"in/a", "in/x"}  # b was deleted from the bucket: forgotten
    cursor.prune(400.0)
    assert set(cursor.handled) == {"in/a"}  # x is older than the look-back now: the watermark alone covers it
    assert _take(bucket + late, cursor, 10, lookback=400.0) == []


def test_cursor_round_trips_and_foreign_cursors_start_over():
    cursor = IntakeCursor()
    _take(_objects("ab", 1000.0), cursor, 10)
    again = IntakeCursor.from_json(cursor.to_json())
    assert again.watermark == 1000.0 and again.handled == cursor.handled
    for foreign in (None, "", "not json", "[1, 2]", '{"handled": {"k": 5}}'):
        fresh = IntakeCursor.from_json(foreign)
        assert fresh.watermark is None and fresh.handled == {}


def test_folder_markers_are_never_documents():
    assert pending_objects([S3Object("in/folder/", "e", 0, 1.0)], IntakeCursor(), 900.0) == []
