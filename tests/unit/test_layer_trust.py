"""The rule for text layers docqueue does not trust (processing/layer_trust.py): look-alike layers flipped, prose in
Latin-script languages, correct Cyrillic and code left alone."""

from __future__ import annotations

import pytest

from processing.layer_trust import (
    LOOKALIKE,
    UNMAPPED,
    distrust_reason,
    hidden_text_share,
    lookalike_share,
    reads_lookalike_script,
)
from tests.pdf_factory import CYRILLIC_TEXT, SCANNED_TEXT, lookalike_reading

PAGE = (0.0, 0.0, 612.0, 792.0)
LINE = (72.0, 72.0, 540.0, 84.0)
SCAN_UNDER_OCR = [("fill-image", PAGE), *[("ignore-text", LINE)] * 40, ("fill-text", (72.0, 770.0, 200.0, 780.0))]
LAYER_UNDER_SCAN = [*[("fill-text", LINE)] * 40, ("fill-image", PAGE)]
BORN_DIGITAL = [("fill-image", (72.0, 400.0, 300.0, 600.0)), *[("fill-text", LINE)] * 40]

ENGLISH = (
    "Trace trees let TraceMonkey compile the hot loops of JavaScript programs written for SpiderMonkey; "
    "McCloskey and others measured them on the SunSpider benchmarks. " + SCANNED_TEXT
)
FRENCH = (
    "Le gardien du phare montait chaque soir l'escalier en colimaçon. Il polissait la grande lentille, taillait la "
    "mèche et notait le temps dans un journal de cuir. Les navires qui longeaient le récif du nord se fiaient à sa "
    "lumière régulière dans le brouillard et la tempête. En hiver, l'île restait coupée du continent pendant des "
    "semaines."
)
GERMAN = (
    "Der Leuchtturmwärter stieg jeden Abend in der Dämmerung die Wendeltreppe hinauf. Er polierte die große Linse, "
    "schnitt den Docht und schrieb das Wetter in ein ledernes Tagebuch. Schiffe, die am nördlichen Riff vorbeifuhren, "
    "verließen sich bei Nebel und Sturm auf sein ruhiges Licht. Im Winter war die Insel wochenlang abgeschnitten."
)
CODE = (
    "const element = document.getElementById(elementId); element.addEventListener('click', onClick); "
    "function onClick(event) { event.preventDefault(); fetchData(requestUrl).then(renderResults); } "
    "export function renderResults(responseData) { resultList.innerHTML = responseData.itemList.map(toListItem); "
    "setTimeout(updateStatusBar, refreshInterval); return responseData.totalCount; }"
)


def _reason(text: str, log=SCAN_UNDER_OCR, languages: str = "eng+rus", max_lookalike_share: float = 0.2):
    return distrust_reason(
        text, lambda: log, max_unmapped_share=0.3, max_lookalike_share=max_lookalike_share, ocr_languages=languages
    )


def test_an_earlier_ocr_reading_cyrillic_as_latin_lookalikes_is_distrusted():
    layer = lookalike_reading(CYRILLIC_TEXT)  # "CMoTpuTenb MaRKa Ka>KAblH Be4ep ..."
    assert lookalike_share(layer) > 0.4
    assert _reason(layer) == LOOKALIKE
    assert _reason(layer, LAYER_UNDER_SCAN) == LOOKALIKE  # a scanner's layer painted under the scan
    assert _reason(layer, languages="ukr") == LOOKALIKE
    assert _reason(layer, languages="ell+eng") == LOOKALIKE


@pytest.mark.parametrize(
    "text", [ENGLISH, FRENCH, GERMAN, CYRILLIC_TEXT], ids=["english", "french", "german", "russian"]
)
def test_prose_is_trusted_even_as_an_earlier_ocr_layer(text):
    assert lookalike_share(text) < 0.1
    assert _reason(text) is None


def test_code_scores_high_but_is_visible_text_and_trusted():
    assert lookalike_share(CODE) > 0.2  # camel case: the score alone would flip it
    assert _reason(CODE, BORN_DIGITAL) is None
    assert _reason(CODE, [("fill-text", LINE)] * 40) is None


def test_only_ocr_languages_of_a_lookalike_script_send_the_page_to_ocr():
    layer = lookalike_reading(CYRILLIC_TEXT)
    assert _reason(layer, languages="") is None  # RapidOCR, Latin only, would read the print worse
    assert _reason(layer, languages="eng+deu") is None
    assert not reads_lookalike_script("") and not reads_lookalike_script("eng+fra")
    assert reads_lookalike_script("eng+rus") and reads_lookalike_script("bul")


def test_a_born_digital_lookalike_layer_is_trusted():
    assert _reason(lookalike_reading(CYRILLIC_TEXT), BORN_DIGITAL) is None


def test_the_threshold_is_the_setting():
    layer = lookalike_reading(CYRILLIC_TEXT)
    assert _reason(layer, max_lookalike_share=1.0) is None


def test_the_drawing_log_is_read_only_for_a_flagged_layer():
    def no_log():
        raise AssertionError("the drawing log was read for a plausible layer")

    for text in (ENGLISH, FRENCH, GERMAN, CYRILLIC_TEXT, ""):
        assert (
            distrust_reason(text, no_log, max_unmapped_share=0.3, max_lookalike_share=0.2, ocr_languages="eng+rus")
            is None
        )


def test_a_short_layer_is_too_short_to_judge():
    assert lookalike_share(lookalike_reading("Налоговая декларация по налогу")) == 0.0


def test_an_unmapped_layer_keeps_its_reason():
    junk = "\x03\x04\x05\x06 \x07\x0e\x0f\x10\x11 @\x04\x0e\x0c 5\x05\x06\x11 Overview\n" * 12
    assert _reason(junk, languages="") == UNMAPPED


def test_hidden_text_share_counts_invisible_text_and_text_under_a_later_picture():
    assert hidden_text_share(SCAN_UNDER_OCR) == pytest.approx(40 / 41)
    assert hidden_text_share(LAYER_UNDER_SCAN) == 1.0
    assert hidden_text_share(BORN_DIGITAL) == 0.0  # the picture comes first and covers no text
    assert hidden_text_share([("fill-path", PAGE)]) == 0.0
