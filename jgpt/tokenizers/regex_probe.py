"""Probing a foreign tokenizer.json's regexes in the sandbox process before they meet a user's text.

A Split pre-tokenizer's, a Replace normalizer's or decoder's pattern is compiled by the HF library's
Oniguruma, which can backtrack for ever on some text or panic past its retry limit. Each pattern is
bounded in size and the file's pipeline is run on probe texts in the bounded child process
(jgpt.tokenizers.sandbox), so that such a file is refused when the tokenizer loads.
"""

from __future__ import annotations

from typing import Any

from jgpt.foundation.errors import ApiError, one_line
from jgpt.tokenizers import sandbox
from jgpt.tokenizers.framing import is_unicode

# A regex in tokenizer.json (a Split pre-tokenizer's, a Replace normalizer's or decoder's pattern) longer
# than this is refused: real ones (GPT-4o's, Llama 3's, Qwen's, DeepSeek's) hold a few hundred characters.
REGEX_LIMIT = 4096
# Each probe text is one character this many times, as is and followed by one that ends no match.
PROBE_LENGTH = 1024
_PROBE_CHARACTERS = "aA1 \n\t.'é日👋\x00"  # letters, digits, spaces and punctuation the usual classes name
_PROBED_CHARACTERS_LIMIT = 128


def check_regexes(spec: dict[str, Any], source: str) -> None:
    """A regex the file declares (compiled by the library's Oniguruma) can backtrack for ever on some text,
    or past Oniguruma's retry limit, where the library panics. Each is bounded in size; then the file's
    normalizer, pre-tokenizer and decoder run in the sandbox process (jgpt.tokenizers.sandbox: CPU, memory and
    wall-clock bounds) on runs of each common character and of each one the regexes name, so that a
    pattern that backtracks exponentially or polynomially on such runs is refused when the tokenizer
    loads rather than on a user's text. A failure that still escapes at use is refused there (`jgpt.tokenizers.hf_tokenizer`'s encoding)."""
    pipeline = {key: spec.get(key) for key in ("normalizer", "pre_tokenizer", "decoder")}
    patterns = list(_regexes(pipeline))
    if not patterns:
        return  # the library's built-in pre-tokenizers (ByteLevel, Whitespace) are its own code
    for pattern in patterns:
        if not isinstance(pattern, str) or len(pattern) > REGEX_LIMIT or not is_unicode(pattern):
            raise ApiError(
                "tokenizer",
                f"{source}: a Regex must be valid Unicode text of at most {REGEX_LIMIT} characters, "
                f"got {one_line(repr(pattern)[:80])}",
            )
    characters = list(dict.fromkeys(_PROBE_CHARACTERS + "".join(patterns)))[:_PROBED_CHARACTERS_LIMIT]
    texts = [character * PROBE_LENGTH + end for character in characters for end in ("", "\x01")]
    try:
        sandbox.probe(pipeline, texts, "tokenizer")
    except ApiError as error:
        raise ApiError(
            "tokenizer",
            f"{source}: its normalizer, pre-tokenizer or decoder {error.reason} "
            f"on a probe text ({PROBE_LENGTH} repetitions of one character)",
        ) from None


def _regexes(value: Any):
    """Every {"Regex": pattern} value inside a parsed tokenizer.json component."""
    if isinstance(value, dict):
        if "Regex" in value:
            yield value["Regex"]
        for child in value.values():
            yield from _regexes(child)
    elif isinstance(value, list):
        for child in value:
            yield from _regexes(child)
