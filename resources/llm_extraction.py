"""Entity and relation extraction through any OpenAI-compatible chat endpoint: schema-constrained JSON, validated
and bounded like the offline extractor's (resources/extraction.py chooses between them)."""

from __future__ import annotations

import json
import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from processing.entities import EntityCollector, Extraction, ExtractionLimits, normalize_entity_name
from queue_db.config import default, secret_value
from queue_db.service_config import ExtractionConfig
from resources.ports import CredentialsRefused

log = logging.getLogger(__name__)

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


class LlmCredentialsRefused(LlmError, CredentialsRefused):
    """The endpoint refused the key (HTTP 401 or 403)."""


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
                refused = response.status_code in (401, 403)
                # redacted before it is cut: a cut through the key would leave its start unredacted
                raise (LlmCredentialsRefused if refused else LlmError)(
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
