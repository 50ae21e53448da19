"""The recorded computation documents `kvsim import-trace` and `kvsim synthesize` write: analytic counts.

The analytic model's sizes are bounded as `import-hf` bounds a config's (kvsim.model_config reads one), and
so are the counts it gives one request (`bounded_model`). A document is written only once kvsim's own reader has accepted it
(`document_bytes`); a refusal of a document converted from a trace names the trace line and column the
refused value came from (`trace_field`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from jgpt.foundation.errors import ApiError
from jgpt.foundation.identity import READ_LIMIT
from jgpt.foundation.validation import LIMIT
from kvsim import traces
from kvsim.analytic import AnalyticModel
from kvsim.recorded import RecordedComputations, document_json, parse_document

# The analytic model's sizes, as `import-hf` bounds a config's (jgpt.artifacts.hf_import.DIMENSION_LIMIT); their
# products are bounded too (`bounded_model`).
DIMENSION_LIMIT = 1 << 20
PRECISION_BYTES_LIMIT = 8  # float64
# The sizes of a GPT-2-shaped model the options give (AnalyticModel's fields), and their defaults.
MODEL_SIZES = {"layers": 4, "width": 128, "ffn": 512, "vocabulary": 260, "precision_bytes": 4, "context": 4096}
_REQUEST_MEMBER = re.compile(r"^computations\.requests\[(\d+)\]\.([a-z_]+)")

Naming = Callable[[ApiError], ApiError | None]  # a refusal of the document, named where its value came from


def sized_model(sizes: dict[str, int]) -> AnalyticModel:
    """The GPT-2-shaped model of the size options (MODEL_SIZES' names)."""
    return AnalyticModel(
        layers=sizes["layers"],
        width=sizes["width"],
        ffn=sizes["ffn"],
        vocabulary=sizes["vocabulary"],
        precision_bytes=sizes["precision_bytes"],
        context=sizes["context"],
    )


def bounded_model(model: AnalyticModel, described: str) -> AnalyticModel:
    """`model`, refused when a count it gives one request is past what kvsim reads (`described` says where
    its sizes came from)."""
    # The largest counts: a whole context's prefill (more FLOPs than any shorter one or any decode step, and
    # more bytes: every weight, and every position's rows and K and V).
    flops, memory = model.prefill(model.context)
    if max(flops, memory) > LIMIT:
        raise ApiError(
            "analytic model",
            f"{described}: a request of the whole context counts {flops} FLOPs and {memory} bytes, past the 2^53 "
            "kvsim reads; choose smaller sizes",
        )
    return model


def document_bytes(computations: RecordedComputations, field: str, named: Naming | None = None) -> bytes:
    """The document's bytes, once kvsim's own reader has accepted them (what an import writes, `kvsim run` must
    read): a refusal names where the refused value came from (`named(error)`), else `field`."""
    document = document_json(computations)
    try:
        parse_document(document)
    except ApiError as error:
        named_error = None if named is None else named(error)
        raise named_error or ApiError(field, f"makes a document kvsim refuses: {error}") from None
    data = json.dumps(document, separators=(",", ":")).encode() + b"\n"
    if len(data) > READ_LIMIT:
        raise ApiError(field, f"makes a {len(data)}-byte document, more than the {READ_LIMIT} kvsim reads")
    return data


def trace_field(trace: traces.Trace, form: str) -> Naming:
    """A refusal of the converted document as the trace line and column the refused value came from."""

    def named(error: ApiError) -> ApiError | None:
        found = _REQUEST_MEMBER.match(error.field)
        if found is None:
            return None
        line, member = trace.lines[int(found[1])], found[2]
        column = traces.COLUMNS[form].get(member)
        return ApiError(
            line if column is None else f"{line}.{column}",
            f"converts to {error.field.removeprefix('computations.')}, which kvsim refuses: {error.reason}",
        )

    return named
