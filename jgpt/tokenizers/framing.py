"""The vocabulary layout and turn framing of jgpt's tokenizer, in pure Python.

Vocabulary layout (fixed across jgpt):

    0..255    the raw bytes, id == byte value
    256..258  role markers <|system|>, <|user|>, <|assistant|>
    259       TURN_END <|turn_end|>
    260..     learned byte-level BPE merges, in merge order

A turn is framed as `[role marker] text-tokens [TURN_END]`; its text is NFC-normalized before
encoding. Nothing here imports numpy or HF `tokenizers`, so that kvsim reads the framing ids of a
generated conversation, and a turn is read from JSON, without either.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Any, Final

from jgpt.foundation.errors import ApiError

ROLES = ("system", "user", "assistant")
BYTE_COUNT = 256
ROLE_IDS = {role: BYTE_COUNT + n for n, role in enumerate(ROLES)}
TURN_END_ID = BYTE_COUNT + len(ROLES)
FIRST_MERGE_ID = TURN_END_ID + 1
CONTROL_MARKERS = {**{ROLE_IDS[role]: f"<|{role}|>" for role in ROLES}, TURN_END_ID: "<|turn_end|>"}

NORMALIZATION: Final = "NFC"


@dataclass(frozen=True)
class Turn:
    """One role-tagged conversation input."""

    role: str  # system | user | assistant
    text: str

    def __post_init__(self):
        if self.role not in ROLE_IDS:
            raise ApiError("role", f"unknown role {self.role!r}; choose one of {', '.join(ROLES)}")
        if not isinstance(self.text, str):
            raise ApiError("text", f"must be a string, got {type(self.text).__name__}")


def normalize(text: str, field_name: str) -> str:
    """NFC-normalize text, rejecting what has no UTF-8 (lone surrogates, e.g. from
    undecodable command-line bytes)."""
    if not isinstance(text, str):
        raise ApiError(field_name, f"must be a string, got {type(text).__name__}")
    return encodable(unicodedata.normalize(NORMALIZATION, text), field_name)


def encodable(text: str, field_name: str) -> str:
    """Text as given, refusing what has no UTF-8: no encoding of a lone surrogate is right (and the HF
    library raises a TypeError on one)."""
    if not isinstance(text, str):
        raise ApiError(field_name, f"must be a string, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ApiError(
            field_name,
            f"is not valid Unicode: lone surrogate U+{ord(error.object[error.start]):04X} "
            f"at character {error.start} (undecodable input bytes?)",
        ) from None
    return text


def is_unicode(text: str) -> bool:
    """Whether text has a UTF-8 encoding (no lone surrogate, which JSON's \\ud800 escape can write)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def turns_from_json(value: Any, field_name: str = "turns") -> tuple[Turn, ...]:
    """Turns from a parsed JSON list of {"role", "text"} objects."""
    if not isinstance(value, list):
        raise ApiError(field_name, f'must be a JSON list of {{"role", "text"}} objects, got {_json_type(value)}')
    turns = []
    for n, item in enumerate(value):
        where = f"{field_name}[{n}]"
        if not isinstance(item, dict):
            raise ApiError(where, f'must be an object with "role" and "text", got {_json_type(item)}')
        for key in ("role", "text"):
            if not isinstance(item.get(key), str):
                reason = "missing" if key not in item else f"must be a string, got {_json_type(item[key])}"
                raise ApiError(f"{where}.{key}", reason)
        if unknown := set(item) - {"role", "text"}:
            raise ApiError(where, f'unknown fields {sorted(unknown)}; a turn has only "role" and "text"')
        try:
            turns.append(Turn(item["role"], item["text"]))
        except ApiError as error:
            raise ApiError(f"{where}.{error.field}", error.reason) from None
    return tuple(turns)


def _json_type(value: Any) -> str:
    names = {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        type(None): "null",
    }
    return names.get(type(value), type(value).__name__)
