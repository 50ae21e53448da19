"""kvsim's name for the readers of `jgpt.validation` (one validation layer for every package).

kvsim modules not yet moved to `jgpt.validation` import the readers from here.
"""

from jgpt.validation import (  # noqa: F401
    LIMIT,
    array,
    integer,
    integers,
    json_number,
    loose_mapping,
    mapping,
    number,
    positive_rate,
    string,
)
