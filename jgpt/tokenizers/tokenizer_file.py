"""Reading a tokenizer file: jgpt's own layout as a Tokenizer, any other Hugging Face tokenizer.json
(an imported model's own) as an HFTokenizer, which keeps the Tokenizer interface and uses the file as is.

The one place that knows both kinds, so that neither class needs the other's subclass.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from jgpt.foundation.validation import is_integer
from jgpt.tokenizers.framing import CONTROL_MARKERS
from jgpt.tokenizers.hf_tokenizer import HFTokenizer
from jgpt.tokenizers.tokenizer import Tokenizer
from jgpt.tokenizers.tokenizer_json import parse_tokenizer_json, read_limited


def load_tokenizer(path: str | os.PathLike, context_limit: int | None = None) -> Tokenizer:
    """jgpt's own tokenizer file, or any other Hugging Face tokenizer.json as an HFTokenizer
    (with the tokenizer_config.json beside it, as Hugging Face saves them)."""
    document = read_limited(Path(path), "tokenizer")
    spec = parse_tokenizer_json(document, str(path))
    if _is_jgpt_layout(spec):
        return Tokenizer.from_spec(document, spec, context_limit, str(path))
    return HFTokenizer.of(document, spec, Path(path).parent, context_limit, str(path))


def _is_jgpt_layout(spec: Any) -> bool:
    """A file that declares any of jgpt's control tokens at its id is jgpt's (and checked as such)."""
    added = spec.get("added_tokens") if isinstance(spec, dict) else None
    return isinstance(added, list) and any(
        CONTROL_MARKERS.get(token["id"]) == token.get("content")
        for token in added
        if isinstance(token, dict) and is_integer(token.get("id"))
    )
