"""HFTokenizer: an imported model's own Hugging Face tokenizer.json, used as is behind the Tokenizer interface.

jgpt's byte tokenizer (jgpt/tokenizers/tokenizer.py) frames turns with its own control ids. A model
imported from Hugging Face keeps the tokenizer it was trained with: its `tokenizer.json`
runs in HF `tokenizers` unchanged (normalizer, pre-tokenizer, BPE merges, post-processor,
decoder), and `tokenizer_config.json` beside it names the EOS token (the stop id) and may
carry a chat template (as may `chat_template.jinja`). Two BPE kinds are read (jgpt/tokenizers/hf_vocabulary.py):

    byte-level        GPT-2's: every vocabulary piece spells bytes through the ByteLevel alphabet
    byte-fallback     Llama's (SentencePiece converted): "▁" spells a space, "<0xNN>" the byte NN

Identity works as for jgpt's files: `tokenizer_sha256` is the SHA-256 of the exact
tokenizer.json bytes; the companions' hashes, the EOS and the template are in the
manifest, so `Encoding.manifest_sha256` names everything that determined the ids.

Protection against forged framing holds here too: text is encoded with special tokens
split (`encode_special_tokens`), so typed "</s>" or "<|endoftext|>" is text, never the
special id. Only the framing (the post-processor's specials, a chat template's own text)
yields special ids. A chat template is data: it is rendered in jinja2's immutable
sandbox, never as code, in the sandbox process (jgpt/tokenizers/sandbox.py) whose memory, CPU time,
wall clock and output are bounded whatever it computes; it is rendered once when the
tokenizer loads, so a template that cannot frame a conversation is refused by import-hf.
Nothing is ever loaded with `trust_remote_code`.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tokenizers

from jgpt.foundation.errors import ApiError, library_failure
from jgpt.foundation.identity import write_atomically
from jgpt.foundation.json_input import parse_json
from jgpt.foundation.paths import confined
from jgpt.tokenizers import sandbox
from jgpt.tokenizers.encoding import (
    BPE_MERGE,
    BYTE,
    UTF8_SEQUENCE,
    Encoding,
    Span,
    bounded_text_spans,
    check_context_limit,
    control_span,
    encoding_of,
)
from jgpt.tokenizers.framing import Turn, encodable
from jgpt.tokenizers.hf_vocabulary import hf_pieces
from jgpt.tokenizers.incremental_decoder import IncrementalDecoder, WindowDecoder
from jgpt.tokenizers.regex_probe import check_regexes
from jgpt.tokenizers.tokenizer import Tokenizer
from jgpt.tokenizers.tokenizer_json import read_limited
from jgpt.tokenizers.utf8_markers import utf8_with_markers
from jgpt.tokenizers.vocabulary import Decoded, PieceTable, Token, checked_ids, describe_piece

CODEC_VERSION = "hf-tokenizers/1"
CONFIG, TEMPLATE = "tokenizer_config.json", "chat_template.jinja"
COMPANIONS = (CONFIG, TEMPLATE)  # saved beside tokenizer.json when the source had them
_TURN_MARK = re.compile("\x00jgpt-turn-(\\d+)\x00")  # stands for a turn's text while a template renders


@dataclass(frozen=True, repr=False)
class HFTokenizer(Tokenizer):
    """A Hugging Face tokenizer.json used as is; read one with `jgpt.tokenizers.tokenizer_file.load_tokenizer`."""

    # Never None here (the base class's None is the byte-level tokenizer's): declared again, in its place.
    _library: tokenizers.Tokenizer = field(compare=False)
    companions: tuple[tuple[str, bytes], ...]  # (file name, exact bytes): part of what the tokenizer is
    eos_id: int = field(compare=False)
    specials: Mapping[int, str] = field(compare=False)  # special added tokens: id -> content
    chat_template: str | None = field(compare=False)
    bos_token: str = field(compare=False)  # what a chat template reads as bos_token
    merges: int = field(compare=False)
    fallback: np.ndarray = field(compare=False)  # [vocab] bool: a byte-fallback piece <0xNN>
    _framing: tokenizers.Tokenizer = field(compare=False)  # recognizes special tokens: for template text only

    def __repr__(self) -> str:
        return (
            f"HFTokenizer(vocab_size={self.vocab_size}, eos_id={self.eos_id}, "
            f"tokenizer_sha256={self.tokenizer_sha256[:16]}..., context_limit={self.context_limit})"
        )

    @classmethod
    def of(cls, document: bytes, spec: Any, directory: Path, context_limit: int | None, source: str) -> HFTokenizer:
        """Check a parsed tokenizer.json (and the companions in `directory`) and bind it."""
        check_context_limit(context_limit)
        pieces, specials, merges, fallback = hf_pieces(spec, source)
        # Confined: a companion that is a link out of the directory is refused, never read.
        companions = {
            name: read_limited(confined(directory, name, "tokenizer"), "tokenizer")
            for name in COMPANIONS
            if os.path.lexists(directory / name)
        }
        config = _config(companions.get(CONFIG), source)
        check_regexes(spec, source)
        text = _library(document, source)
        text.encode_special_tokens = True  # typed special-token text stays text
        framing = _library(document, source)
        eos_id = _token_id(config.get("eos_token"), text, f"{CONFIG}:eos_token")
        template = (
            _text_file(companions[TEMPLATE], TEMPLATE)
            if TEMPLATE in companions
            else _template(config.get("chat_template"))
        )
        bos = config.get("bos_token")
        bos = bos.get("content") if isinstance(bos, dict) else bos
        tokenizer = cls(
            document,
            hashlib.sha256(document).hexdigest(),
            context_limit,
            PieceTable.of(pieces),
            text,
            tuple(companions.items()),
            eos_id,
            specials,
            template,
            encodable(bos, f"{CONFIG}:bos_token") if isinstance(bos, str) else "",
            merges,
            fallback,
            framing,
        )
        if template is not None:
            tokenizer._check_template(TEMPLATE if TEMPLATE in companions else f"{CONFIG}:chat_template")
        return tokenizer

    def save(self, path) -> None:
        """tokenizer.json's exact bytes, and each companion beside it, atomically."""
        write_atomically(Path(path), self.document)
        for name, data in self.companions:
            write_atomically(Path(path).parent / name, data)

    # ---- vocabulary -------------------------------------------------------------------

    @property
    def merge_count(self) -> int:
        return self.merges

    @property
    def turn_end_id(self) -> int:
        """The EOS id: where a reply ends and generation stops."""
        return self.eos_id

    def special_id(self, name: str) -> int | None:
        """The id of the token tokenizer_config.json names as `name` ("bos_token", "pad_token"), or None where it
        names none or one tokenizer.json lacks."""
        config = _config(dict(self.companions).get(CONFIG), "tokenizer")
        content = config.get(name)
        content = content.get("content") if isinstance(content, dict) else content
        return self._library.token_to_id(content) if isinstance(content, str) else None

    def role_id(self, role: str) -> int:
        raise ApiError("role", "a Hugging Face tokenizer has no role ids; its chat template frames roles")

    def token(self, token_id: int) -> Token:
        if not 0 <= token_id < self.vocab_size:
            raise ApiError("id", f"{token_id} is not in the vocabulary of {self.vocab_size}")
        if token_id in self.specials:
            return Token(token_id, "control", self.specials[token_id], "special token")
        piece = self.pieces[token_id]
        return describe_piece(token_id, piece, merge=len(piece) != 1)

    @property
    def manifest(self) -> dict[str, Any]:
        return {
            "codec_version": CODEC_VERSION,
            "context_limit": self.context_limit,
            "control_tokens": {content: token_id for token_id, content in sorted(self.specials.items())},
            "companions_sha256": {name: hashlib.sha256(data).hexdigest() for name, data in sorted(self.companions)},
            "eos_id": self.eos_id,
            "normalization": "declared by tokenizer.json",
            "tokenizer_sha256": self.tokenizer_sha256,
            "unicode_version": _LIBRARY_VERSION,
            "vocab_size": self.vocab_size,
        }

    # ---- encoding ---------------------------------------------------------------------

    def encode_text(self, text: str) -> list[int]:
        """Ids of text as the tokenizer's own pipeline gives them, without special tokens."""
        return _encoded(self._library, encodable(text, "text"), "text", special=False).ids

    def encode_turns(self, turns: Sequence[Turn], *, open_turn: str | None = None) -> Encoding:
        """With a chat template: the turns rendered by it (open_turn adds its generation prompt).
        Without one: a single turn's text with the tokenizer's own special tokens (e.g. Llama's BOS)."""
        if not_turns := [n for n, turn in enumerate(turns) if not isinstance(turn, Turn)]:
            raise ApiError(f"turns[{not_turns[0]}]", f"must be a Turn, got {type(turns[not_turns[0]]).__name__}")
        if open_turn is not None and open_turn != "assistant":
            raise ApiError("open_turn", f"a chat template opens only the assistant's turn, got {open_turn!r}")
        texts = [encodable(turn.text, f"turns[{n}].text") for n, turn in enumerate(turns)]
        if self.chat_template is None:
            if len(turns) != 1:
                raise ApiError(
                    "turns", f"this tokenizer has no chat template, so it encodes exactly one turn, got {len(turns)}"
                )
            ids, spans = self._plain(texts[0])
        else:
            ids, spans = self._templated(self.chat_template, turns, texts, open_turn is not None)
        return encoding_of(ids, spans, turns, texts, open_turn, self.manifest)

    def _plain(self, text: str) -> tuple[list[int], list[Span]]:
        encoding = _encoded(self._library, text, "turns[0].text", special=True)
        ids = encoding.ids
        special = np.asarray(encoding.special_tokens_mask, dtype=bool)
        spans: list[Span] = []
        start = 0
        # Runs of text tokens between the post-processor's special tokens (there are a few at most).
        for stop in [*np.flatnonzero(special).tolist(), len(ids)]:
            spans += self._text_spans(ids[start:stop], encoding.offsets[start:stop], text, start, 0, 0)
            if stop < len(ids):
                spans.append(control_span(ids[stop], stop, 0))
            start = stop + 1
        return ids, spans

    def _templated(
        self, template: str, turns: Sequence[Turn], texts: list[str], generation_prompt: bool
    ) -> tuple[list[int], list[Span]]:
        """Template text is encoded with special tokens recognized (it is the framing); each turn's
        text separately with them split, so no typed text can become framing."""
        eos = self._library.id_to_token(self.eos_id)
        assert eos is not None, "HFTokenizer.of read eos_id from the vocabulary"
        context = {
            "messages": [{"role": turn.role, "content": f"\x00jgpt-turn-{n}\x00"} for n, turn in enumerate(turns)],
            "add_generation_prompt": generation_prompt,
            "eos_token": eos,
            "bos_token": self.bos_token,
        }
        rendered = encodable(sandbox.render(template, context, "chat_template"), "chat_template")
        parts = _TURN_MARK.split(rendered)  # template text, turn index, template text, ...
        order = [int(n) for n in parts[1::2]]
        if order != list(range(len(turns))):
            raise ApiError(
                "chat_template",
                "does not render each turn's text exactly once and in order, so its ids cannot be explained by spans",
            )
        ids: list[int] = []
        spans: list[Span] = []
        byte_offset = 0
        for n, framing in enumerate(parts[0::2]):
            for token_id in _encoded(self._framing, framing, "chat_template", special=False).ids if framing else ():
                spans.append(control_span(token_id, len(ids), n))
                ids.append(token_id)
            if n < len(turns):
                encoding = _encoded(self._library, texts[n], f"turns[{n}].text", special=False)
                spans += self._text_spans(encoding.ids, encoding.offsets, texts[n], len(ids), byte_offset, n)
                ids += encoding.ids
                byte_offset += len(texts[n].encode("utf-8"))
        return ids, spans

    def _check_template(self, origin: str) -> None:
        """Render the template on the conversations every chat command starts with, so that a template
        that cannot frame them is refused when the tokenizer is loaded (by import-hf) rather than at each use."""
        assert self.chat_template is not None
        for roles in (("user",), ("user", "assistant", "user")):
            try:  # no context limit applies: the template is judged, not the conversation's length
                self._templated(
                    self.chat_template, [Turn(role, "Hello.") for role in roles], ["Hello."] * len(roles), True
                )
            except ApiError as error:
                raise ApiError("chat_template", f"{origin} {error.reason}") from None

    def _text_spans(
        self, ids: list[int], offsets: list[tuple[int, int]], text: str, token_offset: int, byte_offset: int, turn: int
    ) -> list[Span]:
        """Spans from the library's offsets: the shortest runs of tokens that do not share a character.

        Offsets are in characters of the text; a character spelled by several tokens (byte
        fallback, or a merge that cuts it) gives each of them that character's offsets.
        """
        if not ids:
            return []
        source = text.encode("utf-8")
        byte_at = _byte_offsets(text)  # [characters + 1]
        starts, ends = (np.asarray(column, dtype=np.int64) for column in zip(*offsets))  # [n] character offsets
        span_ends = np.flatnonzero(np.append(ends[:-1] <= starts[1:], True)) + 1  # [s] token index after each span
        span_starts = np.concatenate([[0], span_ends[:-1]])
        byte_starts = byte_at[np.minimum.reduceat(starts, span_starts)]
        byte_ends = byte_at[np.maximum.reduceat(ends, span_starts)]
        lengths = self.table.lengths[np.asarray(ids)]
        bytewise = np.add.reduceat(lengths != 1, span_starts) == 0  # every piece one byte
        spelled = np.add.reduceat(lengths, span_starts) == byte_ends - byte_starts  # no normalizer added any
        reasons = np.where(
            ~(bytewise & spelled), BPE_MERGE, np.where(span_ends - span_starts == 1, BYTE, UTF8_SEQUENCE)
        )
        bounds = (span_starts, span_ends, byte_starts, byte_ends)
        return bounded_text_spans(ids, source, bounds, reasons, token_offset, byte_offset, turn)

    # ---- decoding ---------------------------------------------------------------------

    def decode(self, ids: Sequence[int], *, final: bool = True) -> Decoded:
        """The tokenizer's own decoding of ids (special tokens shown); the note names malformed UTF-8
        in the bytes the ids spell. With final=False (generation still running), the tokens whose
        text a later id could still change are held back, their bytes as `pending`: those past the
        last whole character, or with byte fallback the trailing run of <0xNN> pieces."""
        checked = checked_ids(ids, self.vocab_size)
        data = self.table.bytes_of(checked)
        _, problem, pending = utf8_with_markers(data, not final)
        ends = np.cumsum(self.table.lengths[checked])  # [n] byte offset after each token
        if final:
            kept = checked.size
        elif self.fallback.any():  # ByteFallback decodes each run of <0xNN> pieces as one group: hold the last run
            kept = int(np.flatnonzero(np.concatenate([[True], ~self.fallback[checked]]))[-1])
        else:  # ByteLevel decodes all bytes at once: hold the tokens past the last whole character
            kept = int(np.searchsorted(ends, len(data) - len(pending), side="right"))
        try:
            text = self._library.decode(checked[:kept].tolist(), skip_special_tokens=False)
        except BaseException as error:
            if not library_failure(error):
                raise
            raise ApiError("ids", f"tokenizer.json's decoder fails on them: {_first_line(error)}") from None
        note = None
        if problem:
            reason, byte = problem
            note = f"{reason} in the token at position {int(np.searchsorted(ends, byte, side='right'))}"
        return Decoded(text, note, data[int(ends[kept - 1]) if kept else 0 :])

    def incremental_decoder(self) -> IncrementalDecoder:
        """`decode` over a bounded window of the ids (jgpt/tokenizers/incremental_decoder.py)."""
        return WindowDecoder(self.decode, self.table.lengths)


_LIBRARY_VERSION = f"tokenizers {tokenizers.__version__}"


def _byte_offsets(text: str) -> np.ndarray:
    """[len(text) + 1] the UTF-8 byte offset of each character boundary."""
    code_points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    widths = 1 + (code_points >= 0x80) + (code_points >= 0x800) + (code_points >= 0x10000)
    return np.concatenate([[0], np.cumsum(widths)]).astype(np.int64)


def _encoded(library: tokenizers.Tokenizer, text: str, field_name: str, *, special: bool) -> tokenizers.Encoding:
    """The library's encoding of text; its failures (a Rust panic, e.g. a regex past Oniguruma's
    backtracking limit on this text) refused naming the field."""
    try:
        return library.encode(text, add_special_tokens=special)
    except BaseException as error:
        if not library_failure(error):
            raise
        raise ApiError(field_name, f"tokenizer.json's pipeline fails on it: {_first_line(error)}") from None


def _first_line(error: BaseException) -> str:
    lines = str(error).splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:300]


def _library(document: bytes, source: str) -> tokenizers.Tokenizer:
    try:
        library = tokenizers.Tokenizer.from_str(document.decode("utf-8"))
    except BaseException as error:  # its own exception types, or a Rust panic on what hf_pieces missed
        if not library_failure(error):
            raise
        raise ApiError("tokenizer", f"{source}: HF tokenizers rejects it: {error}") from None
    # A truncation or padding declared in the file would change ids silently: jgpt limits length itself.
    library.no_truncation()
    library.no_padding()
    return library


def _config(document: bytes | None, source: str) -> dict[str, Any]:
    if document is None:
        raise ApiError(
            "tokenizer",
            f"{source}: no {CONFIG} beside it names the eos_token, which jgpt needs to "
            f"stop generation (Hugging Face's save_pretrained writes it)",
        )
    config = parse_json(document, f"{CONFIG}")
    if not isinstance(config, dict):
        raise ApiError(CONFIG, "must be a JSON object")
    return config


def _token_id(value: Any, library: tokenizers.Tokenizer, field_name: str) -> int:
    content = value.get("content") if isinstance(value, dict) else value
    if not isinstance(content, str):
        raise ApiError(field_name, f"must name a token (jgpt stops generation there), got {value!r}")
    encodable(content, field_name)
    token_id = library.token_to_id(content)
    if token_id is None:
        raise ApiError(field_name, f"{content!r} is not a token of tokenizer.json")
    return token_id


def _template(value: Any) -> str | None:
    """tokenizer_config.json's chat_template: a string, or named templates of which "default" is used."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        if isinstance(named.get("default"), str):
            return named["default"]
    raise ApiError(f"{CONFIG}:chat_template", 'must be a template string or a list with a "default" template')


def _text_file(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ApiError(name, f"is not valid UTF-8 at byte {error.start}") from None
