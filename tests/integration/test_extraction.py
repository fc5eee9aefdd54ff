"""Extractors for real: spaCy with the installed en_core_web_sm model, and the LLM extractor against a local
OpenAI-compatible HTTP server on 127.0.0.1 that stands in for a real LLM (scripted answers, including malformed ones).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from processing.entities import CO_OCCURS, ChunkGraph, Extraction, ExtractionLimits
from queue_db.config import Settings
from resources.extraction import ExtractionResource, SpacyExtractor, plain_text
from resources.llm_extraction import LlmCredentialsRefused, LlmError, LlmExtractor, LlmSettings

REPO = Path(__file__).resolve().parents[2]
CORPUS = Path(os.environ.get("DOCQUEUE_CORPUS", REPO.parent / "shared" / "corpus"))

KNOWN = [
    "Tim Cook, the CEO of Apple, visited Berlin on Monday. Angela Merkel met Tim Cook in Berlin.",
    "Microsoft acquired GitHub in 2018 for $7.5 billion. Satya Nadella leads Microsoft from Redmond, Washington.",
    "GitHub was acquired by Microsoft.",
    "Marie Curie discovered polonium in Paris. She worked at the University of Paris with Pierre Curie.",
]


@pytest.fixture(scope="module")
def spacy_extractor() -> SpacyExtractor:
    return SpacyExtractor(limits=ExtractionLimits())


def entities_of(extraction: Extraction) -> dict[str, str]:
    return {e.name: e.type for e in extraction.entities}


def typed_relations(extraction: Extraction) -> set[tuple[str, str, str]]:
    return {(r.source, r.type, r.target) for r in extraction.relations if r.type != CO_OCCURS}


def assert_well_formed(extraction: Extraction) -> None:
    keys = [e.key for e in extraction.entities]
    assert len(keys) == len(set(keys)) and all(keys)
    for relation in extraction.relations:
        assert relation.source in keys and relation.target in keys and relation.source != relation.target
        assert relation.type and relation.type == relation.type.upper()


# -- spaCy -----------------------------------------------------------------------------------------------------------
def test_spacy_finds_the_obvious_people_organisations_and_places(spacy_extractor):
    results = spacy_extractor.extract(KNOWN)
    assert len(results) == len(KNOWN)
    for extraction in results:
        assert_well_formed(extraction)
    first, second, _, fourth = (entities_of(r) for r in results)
    assert first == {"Tim Cook": "PERSON", "Apple": "ORG", "Berlin": "GPE", "Angela Merkel": "PERSON"}
    assert {"Microsoft": "ORG", "GitHub": "ORG", "Satya Nadella": "PERSON", "Redmond": "GPE"}.items() <= second.items()
    assert {"Marie Curie": "PERSON", "Paris": "GPE", "University of Paris": "ORG"}.items() <= fourth.items()
    # numeric entities (DATE, MONEY, ...) never become nodes
    assert not {"Monday", "2018", "$7.5 billion", "7.5 billion"} & (set(first) | set(second))


def test_spacy_relations_from_verbs_appositives_and_sentences(spacy_extractor):
    first, second, passive, fourth = spacy_extractor.extract(KNOWN)
    assert {
        ("tim cook", "CEO_OF", "apple"),  # appositive "Tim Cook, the CEO of Apple"
        ("tim cook", "VISIT", "berlin"),  # subject-verb-object
        ("angela merkel", "MEET", "tim cook"),
    } <= typed_relations(first)
    assert {("microsoft", "ACQUIRE", "github"), ("satya nadella", "LEAD", "microsoft")} <= typed_relations(second)
    assert typed_relations(passive) == {("microsoft", "ACQUIRE", "github")}  # passive turned active
    assert ("marie curie", "DISCOVER_IN", "paris") in typed_relations(fourth)  # verb + preposition
    cooccurs = {(r.source, r.target) for r in first.relations if r.type == CO_OCCURS}
    assert ("angela merkel", "tim cook") in cooccurs and ("apple", "tim cook") in cooccurs  # sorted pairs
    assert ("angela merkel", "apple") not in cooccurs  # different sentences


def test_spacy_respects_limits_and_handles_empty_and_markdown_input(spacy_extractor):
    limited = SpacyExtractor(limits=ExtractionLimits(max_chars=60, max_entities=2, max_relations=1))
    out = limited.extract([KNOWN[0] + " Later, Barack Obama flew to Hawaii.", "", "   "])
    assert [len(e.entities) for e in out] == [2, 0, 0]
    assert len(out[0].relations) <= 1
    assert "Barack Obama" not in entities_of(out[0])  # beyond max_chars
    markdown = "## Results\n\n| **Alan Turing** | Bletchley Park |\n|---|---|\n*Grace Hopper* joined [IBM](http://x)."
    assert plain_text(markdown).splitlines()[0] == "Results."
    found = entities_of(spacy_extractor.extract([markdown])[0])
    assert {"Alan Turing", "Grace Hopper", "IBM"} <= set(found)
    assert not any("*" in name or "|" in name or "Results" in name for name in found)


@pytest.mark.corpus
def test_spacy_throughput_on_a_real_paper(spacy_extractor, record_property):
    pdf = CORPUS / "pdfjs__tracemonkey.pdf"
    if not pdf.exists():
        pytest.skip(f"corpus not found at {CORPUS}")
    import pymupdf

    with pymupdf.open(pdf) as document:
        text = "\n".join(page.get_text() for page in document)
    chunks = [text[i : i + 1500] for i in range(0, len(text), 1500)][:24]  # enough to measure, fast on 2 cores
    spacy_extractor.extract(chunks[:2])  # warm-up
    started = time.perf_counter()
    results = spacy_extractor.extract(chunks)
    elapsed = time.perf_counter() - started
    for extraction in results:
        assert_well_formed(extraction)
    entities = sum(len(r.entities) for r in results)
    assert entities > len(chunks)  # an academic paper names systems, people and places throughout
    record_property("spacy_chunks_per_s", round(len(chunks) / elapsed, 1))
    print(
        f"\nspaCy extraction: {len(chunks) / elapsed:.1f} chunks/s ({len(chunks)} chunks of 1500 chars, "
        f"{entities} entities, {sum(len(r.relations) for r in results)} relations)"
    )


def test_extracted_graph_lands_in_the_store(spacy_extractor, graph_store):
    results = spacy_extractor.extract(KNOWN)
    graph_store.write_chunks(
        [ChunkGraph("news", "news.pdf", 1, f"news:{i}", i, extraction) for i, extraction in enumerate(results)]
    )
    cook = graph_store.entity("tim cook")
    assert {(r["name"], r["rel_type"]) for r in cook["related"]} >= {("Apple", "CEO_OF"), ("Berlin", "VISIT")}
    microsoft = graph_store.entity("Microsoft")
    acquire = [r for r in microsoft["related"] if r["rel_type"] == "ACQUIRE"]
    assert acquire == [{"name": "GitHub", "type": "ORG", "rel_type": "ACQUIRE", "weight": 2, "direction": "out"}]
    assert graph_store.duplicate_entities() == []


# -- LLM (a local stand-in for an OpenAI-compatible endpoint) ---------------------------------------------------------
API_KEY = "sk-test-" + "s3cr3t" * 4

GOOD = {
    "entities": [
        {"name": "Ada Lovelace", "type": "PERSON"},
        {"name": "Charles Babbage", "type": "PERSON"},
        {"name": "Analytical Engine", "type": "PRODUCT"},
    ],
    "relations": [
        {"source": "Ada Lovelace", "target": "Charles Babbage", "type": "worked with"},
        {"source": "charles babbage", "target": "Analytical Engine", "type": "DESIGNED"},
    ],
}

MALFORMED_ITEMS = {
    "entities": [
        {"name": "Ada Lovelace", "type": "PERSON"},
        {"name": 42, "type": "PERSON"},
        {"type": "ORG"},
        {"name": "  ...  ", "type": "ORG"},
        "London",
        {"name": "London", "type": None},
        {"name": "Royal Society", "type": "org"},
    ],
    "relations": [
        {"source": "Ada Lovelace", "target": "Royal Society", "type": "MEMBER_OF"},
        {"source": "Ada Lovelace", "target": "London", "type": "LIVED_IN"},  # London was dropped
        {"source": "Ada Lovelace", "target": "Nobody", "type": "KNEW"},  # not an entity at all
        {"source": "Ada Lovelace", "target": "ada lovelace", "type": "IS"},  # self-loop
        {"source": "Ada Lovelace", "target": "Royal Society", "type": 7},
        {"source": "Royal Society"},
        ["Ada Lovelace", "Royal Society", "X"],
    ],
}


def chat_reply(content: str, finish_reason: str = "stop") -> dict:
    return {
        "id": "cmpl-1",
        "object": "chat.completion",
        "model": "stand-in",
        "choices": [{"index": 0, "finish_reason": finish_reason, "message": {"role": "assistant", "content": content}}],
    }


class StandInLlm(BaseHTTPRequestHandler):
    """POST /v1/chat/completions; the scenario is chosen by a marker word in the user message."""

    requests: list[dict] = []
    failures_left: dict[str, int] = {}

    def log_message(self, *args):  # keep test output clean
        pass

    def _send(self, status: int, body: dict | str) -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        auth = self.headers.get("Authorization", "")
        StandInLlm.requests.append({"path": self.path, "auth": auth, "body": body})
        if self.path != "/v1/chat/completions":
            return self._send(404, {"error": "not found"})
        if auth != f"Bearer {API_KEY}":
            # a careless server echoing the credential back: our error message must not repeat it
            return self._send(401, {"error": f"invalid key {auth}"})
        text = body["messages"][-1]["content"]
        if "FLAKY" in text and StandInLlm.failures_left.get(text, 1) > 0:
            StandInLlm.failures_left[text] = StandInLlm.failures_left.get(text, 1) - 1
            return self._send(503, {"error": "overloaded"})
        if "NOT_JSON" in text:
            return self._send(200, chat_reply("Sure! The entities are Ada Lovelace and Charles Babbage."))
        if "TRUNCATED" in text:
            return self._send(200, chat_reply('{"entities": [{"name": "Ada', finish_reason="length"))
        if "MALFORMED" in text:
            return self._send(200, chat_reply(json.dumps(MALFORMED_ITEMS)))
        if "FENCED" in text:
            return self._send(200, chat_reply("```json\n" + json.dumps(GOOD) + "\n```"))
        if "EMPTY" in text:
            return self._send(200, chat_reply(json.dumps({"entities": [], "relations": []})))
        return self._send(200, chat_reply(json.dumps(GOOD)))


@pytest.fixture(scope="module")
def llm_endpoint():
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandInLlm)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def llm(llm_endpoint):
    StandInLlm.requests.clear()
    extractor = LlmExtractor(
        LlmSettings(
            base_url=llm_endpoint,
            model="stand-in",
            api_key=API_KEY,
            timeout_s=10,
            max_tokens=512,
            max_retries=2,
            concurrency=2,
        )
    )
    yield extractor
    extractor.close()


def test_llm_request_asks_for_schema_output_and_parses_the_answer(llm):
    [result] = llm.extract(["Ada Lovelace worked with Charles Babbage on the Analytical Engine."])
    request = StandInLlm.requests[-1]
    assert request["auth"] == f"Bearer {API_KEY}"
    body = request["body"]
    assert body["model"] == "stand-in" and body["max_tokens"] == 512
    assert body["response_format"]["type"] == "json_schema"
    schema = body["response_format"]["json_schema"]["schema"]
    assert schema["required"] == ["entities", "relations"]
    assert entities_of(result) == {
        "Ada Lovelace": "PERSON",
        "Charles Babbage": "PERSON",
        "Analytical Engine": "PRODUCT",
    }
    assert typed_relations(result) == {
        ("ada lovelace", "WORKED_WITH", "charles babbage"),
        ("charles babbage", "DESIGNED", "analytical engine"),
    }
    assert_well_formed(result)


def test_llm_malformed_items_are_dropped_and_endpoints_must_be_entities(llm):
    [result] = llm.extract(["MALFORMED please"])
    assert entities_of(result) == {"Ada Lovelace": "PERSON", "Royal Society": "ORG"}
    assert typed_relations(result) == {("ada lovelace", "MEMBER_OF", "royal society")}
    assert_well_formed(result)


def test_llm_answer_that_is_not_json_raises(llm):
    with pytest.raises(LlmError, match="not JSON"):
        llm.extract(["NOT_JSON please"])
    with pytest.raises(LlmError, match="cut off"):
        llm.extract(["TRUNCATED please"])


def test_llm_fenced_json_is_accepted_and_order_is_kept_under_concurrency(llm):
    texts = ["FENCED one", "EMPTY two", "plain three", "EMPTY four"]
    results = llm.extract(texts)
    assert [len(r.entities) for r in results] == [3, 0, 3, 0]
    assert llm.extract(["", "   "]) == [Extraction(), Extraction()]  # nothing sent for blank chunks
    assert len(StandInLlm.requests) == 4


def test_llm_retries_transient_server_errors(llm):
    [result] = llm.extract(["FLAKY but fine"])
    assert len(result.entities) == 3
    assert [r["body"]["messages"][-1]["content"] for r in StandInLlm.requests].count("FLAKY but fine") == 2


def test_llm_key_never_appears_in_errors_or_logs(llm_endpoint, caplog):
    caplog.set_level(logging.DEBUG)
    wrong = LlmExtractor(
        LlmSettings(base_url=llm_endpoint, model="stand-in", api_key=API_KEY + "-wrong", timeout_s=10, max_retries=0)
    )
    with pytest.raises(LlmCredentialsRefused) as raised:  # an LlmError the failure rules class as `auth`
        wrong.extract(["anything"])
    assert "401" in str(raised.value)
    assert API_KEY not in str(raised.value)
    assert API_KEY not in repr(wrong.settings)
    ok = LlmExtractor(LlmSettings(base_url=llm_endpoint, model="stand-in", api_key=API_KEY, timeout_s=10))
    ok.extract(["MALFORMED again"])  # logs how many items it dropped
    assert API_KEY not in caplog.text
    wrong.close()
    ok.close()


def test_llm_unreachable_endpoint_fails_after_bounded_retries():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    extractor = LlmExtractor(
        LlmSettings(base_url=f"http://127.0.0.1:{port}/v1", model="m", api_key=API_KEY, timeout_s=2, max_retries=1)
    )
    started = time.perf_counter()
    with pytest.raises(LlmError, match="after 2 attempts") as raised:
        extractor.extract(["text"])
    assert time.perf_counter() - started < 10
    assert API_KEY not in str(raised.value)


# -- the resource ------------------------------------------------------------------------------------------------------
def test_resource_builds_one_extractor_per_configuration(monkeypatch, llm_endpoint):
    monkeypatch.delenv("DOCQUEUE_EXTRACTOR", raising=False)
    default = ExtractionResource.from_settings(Settings.from_env())
    assert isinstance(default.get_extractor(), SpacyExtractor)
    assert default.get_extractor() is ExtractionResource().get_extractor()

    monkeypatch.setenv("DOCQUEUE_EXTRACTOR", "llm")
    monkeypatch.setenv("DOCQUEUE_LLM_BASE_URL", llm_endpoint)
    monkeypatch.setenv("DOCQUEUE_LLM_MODEL", "stand-in")
    monkeypatch.setenv("DOCQUEUE_LLM_API_KEY", API_KEY)
    resource = ExtractionResource.from_settings(Settings.from_env())
    assert API_KEY not in repr(resource)  # the key reaches the resource as its variable's name, never in run config
    from_settings = resource.get_extractor()
    assert isinstance(from_settings, LlmExtractor) and from_settings.name == "llm:stand-in"
    assert from_settings is ExtractionResource.from_settings(Settings.from_env()).get_extractor()
    assert len(from_settings.extract(["plain"])[0].entities) == 3

    with pytest.raises(ValueError, match="unknown extractor"):
        ExtractionResource(backend="nonsense").get_extractor()
