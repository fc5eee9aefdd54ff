"""The words of a page's text as near-duplicate grouping and the choice of a group's copy compare them: letters and
digits only, with the markup the extraction writes left out.

A text-layer page's markdown carries emphasis (`_loop traces_`, `**3.1**`) and HTML tags (`<mark>`, `<sup>`)
that its re-scan's OCR text and a plain re-typed version do not; read as words (`\\w` takes the underscore, a tag's
name reads as a word), they make copies with the same words look different. Pure."""

from __future__ import annotations

import re

# an HTML tag as page markdown holds them: <mark>, </sup>, <br/>, <span class="x">
HTML_TAG = re.compile(r"</?[A-Za-z][A-Za-z0-9]*(?:\s[^<>]*)?/?>")
# letters and digits: the underscore of markdown emphasis is no part of a word
_WORD = re.compile(r"[^\W_]+", re.UNICODE)


def text_words(text: str) -> list[str]:
    """The words of `text` in order, HTML tags and emphasis marks left out, case kept."""
    return _WORD.findall(HTML_TAG.sub(" ", text))
