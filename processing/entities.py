"""Entities as docqueue keeps them, and the pure rules about them: no store, no model.

An entity's identity is its normalised name (`normalize_entity_name`: NFKC, case-folded, punctuation dropped,
whitespace collapsed); across documents that exact key is the only identity. Within one document a short form of a
fuller name of the same type ("Lessig" after "Lawrence Lessig", "Microsoft" after "Microsoft Corporation"; see
`SHORT_FORM_RULE`) is that entity (`resolve_aliases`). A name the tagger produced is kept only when its type's rules
allow it (`type_rule_violation`); types and relation types are UPPER_SNAKE (`entity_type`, `relation_type`).
`EntityCollector` gathers one chunk's entities and relations under `ExtractionLimits`, whichever extractor read it.

The value types here (`Entity`, `Relation`, `Extraction`, `ChunkGraph`) are what an extractor produces and what the
graph store writes (resources/ports.GraphStore).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field

from queue_db.config import default
from queue_db.service_config import ExtractionConfig
from queue_db.tenants import BASE_TENANT, bare_entity_key, split_entity_key

MAX_NAME_CHARS = 200
MAX_TYPE_CHARS = 50
CO_OCCURS = "CO_OCCURS"  # the undirected relation of two entities of one sentence


# -- entity names ----------------------------------------------------------------------------------------------------
def normalize_entity_name(name: str) -> str:
    """The identity of an entity name: NFKC, case-folded, punctuation removed, whitespace collapsed.

    Dashes, slashes and underscores separate words ("Smith-Jones" == "Smith Jones"); other punctuation joins them
    ("U.S.A." == "USA", "O'Brien" == "OBrien").  Invisible format characters (zero-width space, soft hyphen) vanish.
    """
    text = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", name).casefold())
    pieces = []
    for ch in text:
        category = unicodedata.category(ch)
        if ch.isspace() or category in ("Pd", "Cc", "Zl", "Zp") or ch in "/\\_":
            pieces.append(" ")
        elif category.startswith("P") or category == "Cf":
            continue
        else:
            pieces.append(ch)
    return " ".join("".join(pieces).split())


# -- what is written -------------------------------------------------------------------------------------------------
@dataclass
class Entity:
    name: str
    type: str
    key: str = ""  # normalize_entity_name(name) when not given

    def __post_init__(self) -> None:
        if not self.key:
            self.key = normalize_entity_name(self.name)


@dataclass
class Relation:
    source: str  # entity key
    target: str  # entity key
    type: str


@dataclass
class Extraction:
    entities: list[Entity] = field(default_factory=list)
    relations: list[Relation] = field(default_factory=list)
    rejected: dict[str, int] = field(default_factory=dict)  # entity type -> names its type rules turned down


@dataclass
class ChunkGraph:
    document_id: str
    filename: str
    page_number: int
    chunk_id: str
    chunk_index: int
    extraction: Extraction
    tenant_id: str = BASE_TENANT


# -- aliases within a document ---------------------------------------------------------------------------------------
# Types whose short forms stand for a fuller name within one document, and how they are shortened: a person to the
# surname (the last words; given names and initials go), an organisation by dropping its legal form ("Microsoft
# Corporation" -> "Microsoft", but "Microsoft Research" is another organisation), a work or a law to the head of its
# title ("Free Culture: How Big Media ..." -> "Free Culture", "Copyright Act of 1976" -> "Copyright Act").  Places,
# products and events are never shortened: "York" is not "New York", "Windows" not "Windows 95", "World War" not
# "World War II".
SHORT_FORM_RULE = {"PERSON": "surname", "ORG": "legal_form", "WORK_OF_ART": "head", "LAW": "head"}
LEGAL_FORMS = frozenset(
    {
        "inc",
        "incorporated",
        "corp",
        "corporation",
        "co",
        "company",
        "ltd",
        "limited",
        "llc",
        "plc",
        "gmbh",
        "ag",
        "sa",
        "nv",
        "bv",
        "holdings",
    }
)
# "a", "ja", "c": one or two letters are initials or tagger debris, too common to stand for one name
MIN_SHORT_FORM_CHARS = 3


def is_short_form(short: str, full: str, type_: str) -> bool:
    """`short` (a key) is `full` (a key) shortened the way names of `type_` are shortened in running text."""
    rule = SHORT_FORM_RULE.get(type_)
    (short_tenant, short), (full_tenant, full) = split_entity_key(short), split_entity_key(full)
    if short_tenant != full_tenant:
        return False  # two tenants' names
    short_words, full_words = short.split(), full.split()
    if rule is None or not short_words or len(short_words) >= len(full_words):
        return False
    if sum(ch.isalpha() for ch in short) < MIN_SHORT_FORM_CHARS:
        return False
    if rule == "surname":
        # a word without a letter ("d 95") makes the longer name debris, not a person's full name
        return full_words[-len(short_words) :] == short_words and all(
            any(ch.isalpha() for ch in word) for word in full_words
        )
    if full_words[: len(short_words)] != short_words:
        return False
    return rule == "head" or all(word in LEGAL_FORMS for word in full_words[len(short_words) :])


def resolve_aliases(entities: Iterable[tuple[str, str]], recorded: dict[str, str] | None = None) -> dict[str, str]:
    """Within one document: short key -> the key of the fuller name of the same type it stands for.

    `entities` are the document's (key, type) pairs, in any order: the answer depends on the set only, so the chunks
    of a document can arrive in any order.  A short form resolves when exactly one longest name contains it; with two
    ("Smith": "Adam Smith", "John Smith") it stays itself, since guessing would merge two people.  `recorded` holds
    aliases already written for the document (short -> full): they stand when the set alone no longer decides, so
    re-running an early chunk keeps what was resolved.
    """
    by_type: dict[str, set[str]] = {}
    for key, type_ in entities:
        if key:
            by_type.setdefault(type_, set()).add(key)
    longest_of: dict[str, set[str]] = {}  # a key read under several types gathers the candidates of each
    for type_, keys in by_type.items():
        if type_ not in SHORT_FORM_RULE:
            continue
        # a short form shares its kept end word with every name it shortens: compare within those groups only
        end_word = -1 if SHORT_FORM_RULE[type_] == "surname" else 0
        sharing: dict[str, list[str]] = {}
        for key in keys:
            sharing.setdefault(bare_entity_key(key).split()[end_word], []).append(key)
        for short in keys:
            group = sharing[bare_entity_key(short).split()[end_word]]
            fuller = [full for full in group if is_short_form(short, full, type_)]
            longest_of.setdefault(short, set()).update(
                full for full in fuller if not any(is_short_form(full, other, type_) for other in fuller)
            )
    resolved = {short: next(iter(longest)) for short, longest in longest_of.items() if len(longest) == 1}
    for short, full in (recorded or {}).items():
        resolved.setdefault(short, full)
    final = {short: _final_target(short, resolved) for short in resolved}
    return {short: full for short, full in final.items() if short != full}


def _final_target(key: str, resolved: dict[str, str]) -> str:
    """Follows short -> full links to their end (a name read under two types can link on); on a cycle there is no
    one fuller name, so the key stays itself."""
    target, seen = key, {key}
    while target in resolved:
        target = resolved[target]
        if target in seen:
            return key
        seen.add(target)
    return target


# -- shared cleaning -----------------------------------------------------------------------------------------------
def relation_type(text: str) -> str:
    """UPPER_SNAKE, letters and digits only, bounded; '' when nothing usable is left."""
    cleaned = re.sub(r"[^0-9A-Za-z]+", "_", text).strip("_").upper()
    return cleaned[:MAX_TYPE_CHARS].rstrip("_")


def entity_type(text: str) -> str:
    return relation_type(text) or "OTHER"


# "205–7 Clark", "12 Lessig", "3-4 Smith": a number or number range opening a name is an index or citation locator
# (page, footnote, section) that the tagger glued to the name after it
_LEADING_LOCATOR = re.compile(r"^\d+(?:\s*[-‐‑‒–—]\s*\d+)?\s+\S")
_URL_MARKS = ("@", "://", "www.")
_ET_AL = re.compile(r"\bet\.?\s+al\b", re.IGNORECASE)  # "Zaleski et al." names a paper by its first author
MAX_PERSON_WORDS = 6


def type_rule_violation(name: str, type_: str) -> str | None:
    """Why a (name, type) the tagger produced cannot be that type, or None when it is plausible.

    Every type: a leading number or number range is a locator, not part of a name.  PERSON is stricter because
    people's names are written in letters: no digit anywhere (page and footnote numbers, years), a word of two or
    more letters (initials alone, "J. R.", identify nobody), no URL or e-mail marks, no "et al." (a citation of a
    paper), and a bounded word count (a longer span is a line of running text or a citation read as one name).
    """
    if _LEADING_LOCATOR.match(name):
        return "leading number"
    if type_ != "PERSON":
        return None
    if any(ch.isdigit() for ch in name):
        return "digit in a person name"
    if any(mark in name.lower() for mark in _URL_MARKS):
        return "address, not a person"
    if _ET_AL.search(name):
        return "citation, not a person"
    words = name.split()
    if len(words) > MAX_PERSON_WORDS:
        return "too many words for a person name"
    if not any(sum(ch.isalpha() for ch in word) >= 2 for word in words):
        return "no word of two letters"
    return None


# -- one chunk's extraction ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExtractionLimits:
    max_chars: int = default(ExtractionConfig, "max_chars")  # text per chunk fed to the model; the rest is ignored
    batch_size: int = default(ExtractionConfig, "batch_size")  # texts per nlp.pipe batch
    max_entities: int = default(ExtractionConfig, "max_entities")  # per chunk
    # per chunk (typed relations first, then co-occurrences)
    max_relations: int = default(ExtractionConfig, "max_relations")
    # co-occurrence pairs are quadratic: only the first N entities of a sentence
    max_sentence_entities: int = default(ExtractionConfig, "max_sentence_entities")

    @classmethod
    def from_config(cls, env: ExtractionConfig) -> ExtractionLimits:
        return cls(
            max_chars=env.max_chars,
            batch_size=env.batch_size,
            max_entities=env.max_entities,
            max_relations=env.max_relations,
            max_sentence_entities=env.max_sentence_entities,
        )


class EntityCollector:
    """Accumulates one chunk's entities and relations under the limits, deduplicated by key / signature."""

    def __init__(self, limits: ExtractionLimits):
        self.limits = limits
        self.entities: dict[str, Entity] = {}
        self.rejected: dict[str, int] = {}  # entity type -> distinct names the type rules turned down
        self._rejected_keys: set[str] = set()
        self.typed: dict[tuple[str, str, str], None] = {}
        self.cooccurs: dict[tuple[str, str, str], None] = {}

    def add_entity(self, name: str, type_: str) -> str | None:
        """Returns the entity's key, or None when the name is unusable or the chunk is full."""
        name = " ".join(name.split())
        if not name or len(name) > MAX_NAME_CHARS or not any(ch.isalpha() for ch in name):
            return None
        key = normalize_entity_name(name)
        if not key:
            return None
        if key not in self.entities:
            type_ = entity_type(type_)
            if type_rule_violation(name, type_):
                if key not in self._rejected_keys:
                    self._rejected_keys.add(key)
                    self.rejected[type_] = self.rejected.get(type_, 0) + 1
                return None
            if len(self.entities) >= self.limits.max_entities:
                return None
            self.entities[key] = Entity(name=name, type=type_, key=key)
        return key

    def add_relation(self, source: str | None, target: str | None, type_: str) -> None:
        type_ = relation_type(type_)
        if not source or not target or source == target or not type_:
            return
        if source not in self.entities or target not in self.entities:
            return
        if type_ == CO_OCCURS:
            # undirected: one edge per pair, whichever order the entities came in
            source, target = sorted((source, target))
            self.cooccurs.setdefault((source, target, type_), None)
        else:
            self.typed.setdefault((source, target, type_), None)

    def result(self) -> Extraction:
        signatures = list(self.typed) + [sig for sig in self.cooccurs if sig not in self.typed]
        relations = [Relation(s, t, ty) for s, t, ty in signatures[: self.limits.max_relations]]
        return Extraction(entities=list(self.entities.values()), relations=relations, rejected=dict(self.rejected))
