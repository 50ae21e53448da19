"""Sizes read from input, bounded before anything is allocated for them.

A size in a file or on the command line decides how much memory a command asks for; an
absurd one (a vocabulary of 10^9 aborted the process asking for 70 GB) must be refused
as an ApiError naming the field, never attempted. The limits sit far above anything
jgpt trains or serves and far below what a machine cannot hold.
"""

from __future__ import annotations

from jgpt.errors import ApiError
from jgpt.validation import integer

# Tokenizer training and model vocabularies: 2^17 holds every public byte-level vocabulary
# we know of (Llama 3: 128,256 entries).
VOCABULARY_LIMIT = 1 << 17
# Generated conversations for training or evaluation (40,000 train the shipped model; each
# holds at most a context of ids, so 10^6 of them stay within a few hundred MB).
CONVERSATION_LIMIT = 1_000_000
# Model parameters allocated by training or an import: 2^31 float32 values are 8 GiB.
PARAMETER_LIMIT = 1 << 31


def bounded(value: int, field: str, minimum: int, limit: int) -> int:
    """`value` when it is an integer in [minimum, limit]; else an ApiError naming `field` and the range."""
    try:
        return integer(value, field, minimum, limit)
    except ApiError:  # one message with the whole range: these fields are command-line options too
        raise ApiError(field, f"must be an integer in [{minimum}, {limit}], got {value!r}") from None
