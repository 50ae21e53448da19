"""PromptFormat: how a model's prompts are framed, as its artifact declares it.

    chat           jgpt's turn framing (jgpt.tokenizers.framing): `[role] text [TURN_END]` per turn and the
                   assistant's marker opening the reply. A model trained on the built-in conversations.
    chat-template  an imported tokenizer's own chat template, rendered in the sandbox
                   (jgpt.tokenizers.sandbox), its generation prompt opening the reply.
    plain          no framing: the text's ids as the tokenizer encodes a document (jgpt's tokenizer: the ids of
                   its UTF-8; an imported one: its own pipeline, with the special tokens its post-processor adds,
                   e.g. Llama's BOS, as transformers' `tokenizer(text)` gives them). A model trained on a text file.

A chat model's prompt is a conversation; a plain model's is a text it continues. `framed` is the one place
that turns a prompt into ids by a format, for every command and the HTTP chat endpoint.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jgpt.foundation.errors import ApiError
from jgpt.foundation.json_input import read_json
from jgpt.tokenizers.framing import Turn
from jgpt.tokenizers.hf_tokenizer import CONFIG, TEMPLATE, HFTokenizer
from jgpt.tokenizers.tokenizer import Tokenizer

CHAT, CHAT_TEMPLATE, PLAIN = "chat", "chat-template", "plain"
PROMPT_FORMATS = (CHAT, CHAT_TEMPLATE, PLAIN)
FIELD = "prompt_format"  # the ModelArtifact manifest's field
# TrainingProvenance.kind of a model trained on a text file, and InitializationProvenance.kind of an imported one.
TEXT_TRAINING, IMPORT = "text", "import"


def check_prompt_format(value: Any, field: str = FIELD) -> str:
    if value not in PROMPT_FORMATS:
        raise ApiError(field, f"must be one of {', '.join(PROMPT_FORMATS)}, got {value!r}")
    return value


def implied_prompt_format(provenance: Mapping[str, Any], has_chat_template: bool) -> str:
    """The format of an artifact whose manifest declares none (written before manifests declared it), from what
    the artifact is: trained on a text file -> plain; imported -> chat-template when its tokenizer has a chat
    template, else plain; anything else (trained on the built-in conversations, or initialized) -> chat, the
    framing every prompt had before the declaration."""
    kind = provenance.get("kind")
    if kind == TEXT_TRAINING:
        return PLAIN
    if kind == IMPORT:
        return CHAT_TEMPLATE if has_chat_template else PLAIN
    return CHAT


def imported_prompt_format(tokenizer: Tokenizer | None, directory: Path) -> str:
    """An imported model's format: a chat model when its tokenizer files in `directory` carry a chat template
    (framed by jgpt's turn framing when the tokenizer has jgpt's layout, as a jgpt export imported back does),
    else plain."""
    if tokenizer is None or not has_chat_template(directory):
        return PLAIN
    return conversation_format(tokenizer) or PLAIN


def has_chat_template(directory: Path) -> bool:
    """Whether the tokenizer files in `directory` carry a chat template (chat_template.jinja, or
    tokenizer_config.json's chat_template)."""
    if (directory / TEMPLATE).is_file():
        return True
    config = directory / CONFIG
    if not config.is_file():
        return False
    document = read_json(config, CONFIG)
    return isinstance(document, dict) and document.get("chat_template") is not None


def conversation_format(tokenizer: Tokenizer) -> str | None:
    """The chat format a tokenizer can frame: jgpt's turn framing, an imported tokenizer's chat template, or
    None (an imported tokenizer without one frames no roles)."""
    if not isinstance(tokenizer, HFTokenizer):
        return CHAT
    return None if tokenizer.chat_template is None else CHAT_TEMPLATE


def check_fits(prompt_format: str, tokenizer: Tokenizer, field: str = FIELD) -> None:
    """Refuse a chat format the tokenizer cannot frame (a plain one fits every tokenizer)."""
    check_prompt_format(prompt_format, field)
    able = conversation_format(tokenizer)
    if prompt_format != PLAIN and prompt_format != able:
        can = "no chat framing" if able is None else f"only {able!r}"
        raise ApiError(field, f"{prompt_format!r} does not fit the model's tokenizer, which has {can}")


def framed(tokenizer: Tokenizer, prompt_format: str, turns: Sequence[Turn], field: str = "turns") -> list[int]:
    """The prompt ids of a conversation: under a chat format the turns framed and the assistant's turn opened;
    under plain the one user turn's text as it stands (a plain model has no roles, so anything else is refused)."""
    check_fits(prompt_format, tokenizer)
    if prompt_format != PLAIN:
        return list(tokenizer.encode_turns(turns, open_turn="assistant").ids)
    if len(turns) != 1 or turns[0].role != "user":
        roles = ", ".join(turn.role for turn in turns) or "none"
        raise ApiError(
            field,
            f"a plain-text model (prompt_format {PLAIN!r}) continues one text and frames no roles, got turns "
            f"of {roles}; give the text alone (or frame it anyway with --chat)",
        )
    return plain_ids(tokenizer, turns[0].text)


def plain_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    """A text's ids as the tokenizer encodes a document, no roles framed."""
    if isinstance(tokenizer, HFTokenizer):
        # Without its template an imported tokenizer encodes one turn as a document: its own pipeline, specials included.
        document = dataclasses.replace(tokenizer, chat_template=None)
        return list(document.encode_turns([Turn("user", text)]).ids)
    return tokenizer.encode_text(text)
