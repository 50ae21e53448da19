"""An Encoding's spans as a table a person can read: which bytes each group of ids spells, and why.

The core's own view of an Encoding, so that every face (`jgpt tokenize`, the demo)
prints the same table without importing another face.
"""

from __future__ import annotations

import json

from jgpt.tokenizers.encoding import BPE_MERGE, Encoding
from jgpt.tokenizers.tokenizer import CODEC_VERSION, Tokenizer


def _normalization(encoding: Encoding) -> str:
    """jgpt's NFC by Python's Unicode tables, or an imported tokenizer's own normalizer, run by the library."""
    if encoding.codec_version == CODEC_VERSION:
        return f"NFC (Unicode {encoding.unicode_version})"
    return f"tokenizer.json's normalizer ({encoding.unicode_version})"


def render(encoding: Encoding, tokenizer: Tokenizer) -> str:
    """The spans as a table a person can read, then the decoded text."""
    limit = "none" if encoding.context_limit is None else encoding.context_limit
    header = [
        f"tokenizer {tokenizer.tokenizer_sha256[:16]}  vocabulary {tokenizer.vocab_size}  "
        f"{_normalization(encoding)}  codec {encoding.codec_version}  context_limit {limit}",
        f"{encoding.input_kind}: {len(encoding.ids)} ids, {len(encoding.spans)} spans, "
        f"input_sha256 {encoding.input_sha256[:16]}",
        f"{'tokens':>9}  {'bytes':>9}  turn  {'kind':<7}  {'reason':<14}  {'ids':<24}  text",
    ]
    rows = []
    for span in encoding.spans:
        if span.kind == "control":
            byte_range, text = "-", tokenizer.token(span.ids[0]).piece
        else:
            byte_range = f"{span.byte_start}:{span.byte_end}"
            text = json.dumps(span.raw_bytes.decode("utf-8"), ensure_ascii=False)
            if len(span.ids) > 1 and span.reason == BPE_MERGE:  # a merge cuts a character: show how
                text += " = " + " + ".join(
                    json.dumps(tokenizer.token(token_id).piece, ensure_ascii=False) for token_id in span.ids
                )
        ids = " ".join(map(str, span.ids))
        rows.append(
            f"{span.token_start:>4}:{span.token_end:<4}  {byte_range:>9}  {span.turn:>4}  {span.kind:<7}  "
            f"{span.reason:<14}  {ids:<24}  {text}"
        )
    decoded = tokenizer.decode(encoding.ids)
    footer = [f"decoded: {decoded.text}"] + ([f"decoding note: {decoded.note}"] if decoded.note else [])
    return "\n".join(header + rows + footer)
