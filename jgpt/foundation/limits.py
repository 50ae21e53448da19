"""Sizes read from input, bounded before anything is allocated for them.

A size in a file or on the command line decides how much memory a command asks for; an
absurd one (a vocabulary of 10^9 aborted the process asking for 70 GB) must be refused
as an ApiError naming the field, never attempted. The limits sit far above anything
jgpt trains or serves and far below what a machine cannot hold.
"""

from __future__ import annotations

from jgpt.foundation.errors import ApiError
from jgpt.foundation.validation import integer

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


# Bytes of the buffers an inference run allocates up front for its sizes (a generation's KV state, ids,
# kept logits and draft logs; the engine's slot KV state and the states its pool may retain): 2^33 = 8 GiB,
# the weights' own limit (PARAMETER_LIMIT float32 values). The shipped chat model needs a few MB; a budget
# or a slot count sized past this ended in the OOM killer or an XLA out-of-memory traceback.
BUFFER_LIMIT = 1 << 33


def check_buffer(nbytes: int, field: str, what: str) -> None:
    """Refuse, naming `field`, a buffer of `nbytes` past BUFFER_LIMIT, before anything is allocated for it."""
    if nbytes > BUFFER_LIMIT:
        raise ApiError(
            field,
            f"{what} would need {nbytes:,} bytes, more than the limit of {BUFFER_LIMIT:,} (jgpt.foundation.limits.BUFFER_LIMIT)",
        )
