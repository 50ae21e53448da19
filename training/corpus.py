"""A corpus prepared for training: tokenizer, device-ready splits and the hash of the data used.

Two sources: the built-in conversations (byte tokens, loss on assistant tokens
only) and a UTF-8 text file split by position into train and development
(byte tokens or BPE merges learned from the training part, loss on every token).
A fine-tuning run encodes either with its parent's tokenizer instead.
Every check on the input happens here, before a run writes anything.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jgpt.foundation.errors import ApiError
from jgpt.foundation.identity import read_bytes
from jgpt.tokenizers.tokenizer import Tokenizer
from training import conversation_corpus
from training.batches import TokenRows, TokenStream, rows_from_sequences
from training.config import TrainingConfig
from training.conversation_corpus import Conversation

# Development loss of a text corpus reads at most this many windows.
MAX_DEVELOPMENT_WINDOWS = 256


@dataclass(frozen=True)
class HeldOutExercise:
    """One scored assistant turn of a development conversation: the prompt ends with the assistant marker."""

    skill: str
    prompt: tuple[int, ...]
    answer: str


@dataclass(frozen=True)
class PreparedCorpus:
    kind: str  # "conversations" | "text"
    data_sha256: str
    tokenizer: Tokenizer
    train: TokenRows | TokenStream | None  # None when only evaluating
    development: TokenRows
    development_bytes: int  # UTF-8 bytes of the counted development targets (for bits per byte)
    exercises: tuple[HeldOutExercise, ...]  # empty for text


def encode_conversation(tokenizer: Tokenizer, conversation: Conversation) -> tuple[list[int], list[int]]:
    """Framed ids and loss weights: 1 on an assistant turn's text tokens and its TURN_END."""
    ids: list[int] = []
    weights: list[int] = []
    for role, text in conversation.turns():
        body = [*tokenizer.encode_text(text), tokenizer.turn_end_id]
        ids += [tokenizer.role_id(role), *body]
        weights += [0] + [int(role == "assistant")] * len(body)
    return ids, weights


def exercises_of(tokenizer: Tokenizer, conversation: Conversation) -> list[HeldOutExercise]:
    ids, _ = encode_conversation(tokenizer, conversation)
    found = []
    cursor = 0 if conversation.system is None else len(tokenizer.encode_text(conversation.system)) + 2
    for exchange in conversation.exchanges:
        cursor += len(tokenizer.encode_text(exchange.request)) + 3  # user marker, TURN_END, assistant marker
        if exchange.skill is not None:
            found.append(HeldOutExercise(exchange.skill, tuple(ids[:cursor]), exchange.answer))
        cursor += len(tokenizer.encode_text(exchange.answer)) + 1
    return found


def _rows(tokenizer: Tokenizer, conversations, width: int) -> tuple[TokenRows, int]:
    encoded = [encode_conversation(tokenizer, c) for c in conversations]
    pieces = np.fromiter(map(len, tokenizer.pieces), np.int64)
    counted_bytes = sum(int(pieces[ids[1:]][np.asarray(w[1:], bool)].sum()) for ids, w in encoded)
    rows = rows_from_sequences([ids for ids, _ in encoded], [w for _, w in encoded], width, tokenizer.turn_end_id)
    return rows, counted_bytes


def conversations(config: TrainingConfig, tokenizer: Tokenizer | None = None) -> PreparedCorpus:
    """The built-in conversations, framed by `tokenizer` (default: the byte tokenizer)."""
    tokenizer = Tokenizer.bytes_only() if tokenizer is None else tokenizer
    try:
        tokenizer.role_id("user")
    except ApiError:
        raise ApiError(
            "init_from",
            f"the tokenizer of {config.init_from} has no role ids to frame the built-in conversations with; "
            "train it on a text file (--data FILE)",
        ) from None
    width = config.window + 1
    corpus = conversation_corpus.generate(
        config.seed, config.train_conversations, config.development_conversations, max_tokens=width
    )
    longest = max(c.byte_length() for c in corpus.train + corpus.development)
    if longest > width:
        raise ApiError("context", f"{config.window} tokens cannot hold a built-in conversation (needs {longest - 1})")
    train, _ = _rows(tokenizer, corpus.train, width)
    return held_out_conversations(tokenizer, corpus.development, width, train, corpus.data_sha256)


def held_out_conversations(tokenizer, development, width, train=None, data_sha256=None) -> PreparedCorpus:
    """The development side of a conversation corpus (`train` is None when only evaluating)."""
    rows, counted_bytes = _rows(tokenizer, development, width)
    exercises = tuple(e for c in development for e in exercises_of(tokenizer, c))
    if data_sha256 is None:
        data_sha256 = hashlib.sha256(conversation_corpus.jsonl_document({"development": development})).hexdigest()
    return PreparedCorpus("conversations", data_sha256, tokenizer, train, rows, counted_bytes, exercises)


def read_text(path: str) -> tuple[bytes, str]:
    """The file's exact bytes and its text; missing, empty or non-UTF-8 files are rejected."""
    file = Path(path)
    if not file.is_file():
        raise ApiError("data", f"{path} is not a regular file" if file.exists() else f"file not found: {path}")
    data = read_bytes(file, "data")
    if not data.strip():
        raise ApiError("data", f"{path} is empty")
    try:
        return data, data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ApiError("data", f"{path} is not UTF-8 text ({error.reason} at byte {error.start})") from None


def text(config: TrainingConfig, path: str, tokenizer: Tokenizer | None = None) -> PreparedCorpus:
    """The text file at `path`, encoded by `tokenizer` (a parent's) or by the one the config names."""
    data, content = read_text(path)
    train_text, development_text = split_text(content, config.development_fraction)
    if tokenizer is None:
        tokenizer = _own_tokenizer(config, train_text, path)
    train_ids = _ids(tokenizer, train_text, config.window, "train", path)
    return held_out_text(tokenizer, development_text, config.window, path, hashlib.sha256(data).hexdigest(),
                         TokenStream(train_ids, config.window))  # fmt: skip


def _own_tokenizer(config: TrainingConfig, train_text: str, path: str) -> Tokenizer:
    """The byte tokenizer, or BPE merges learned from the training part."""
    if config.tokenizer != "bpe":
        return Tokenizer.bytes_only()
    assert config.vocab_size is not None, "TrainingConfig.__post_init__ sets vocab_size"
    tokenizer = Tokenizer.train([train_text], config.vocab_size)
    if tokenizer.vocab_size != config.vocab_size:
        raise ApiError("vocab_size", f"{path} supports only {tokenizer.vocab_size} tokens, not {config.vocab_size}")
    return tokenizer


def split_text(content: str, development_fraction: float) -> tuple[str, str]:
    """Split by position: the last `development_fraction` of the characters is held out."""
    cut = int(len(content) * (1 - development_fraction))
    return content[:cut], content[cut:]


def _ids(tokenizer: Tokenizer, text: str, window: int, part: str, path: str) -> np.ndarray:
    ids = np.asarray(tokenizer.encode_text(text), np.int32)
    if ids.size < window + 1:
        raise ApiError("data", f"the {part} part of {path} has {ids.size} tokens; context {window} needs {window + 1}")
    return ids


def held_out_text(tokenizer, development_text, window, path, data_sha256, train=None) -> PreparedCorpus:
    """The development side of a text corpus (`train` is None when only evaluating)."""
    ids = _ids(tokenizer, development_text, window, "development", path)
    development = TokenStream(ids, window).tiled(MAX_DEVELOPMENT_WINDOWS)
    pieces = np.fromiter(map(len, tokenizer.pieces), np.int64)
    counted_bytes = int(pieces[np.asarray(development.tokens)[:, 1:]].sum())
    return PreparedCorpus("text", data_sha256, tokenizer, train, development, counted_bytes, ())


def prepare(config: TrainingConfig, tokenizer: Tokenizer | None = None) -> PreparedCorpus:
    """The config's corpus; `tokenizer` is the parent's of a fine-tuning run (None: the config's own)."""
    return conversations(config, tokenizer) if config.data is None else text(config, config.data, tokenizer)
