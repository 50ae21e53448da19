"""Generate `jgpt/foundation/ontology.json` from the team's ontology text.

Run once when the spec changes:

    python tools/ontology_from_spec.py /work/shared/spec/ontology.txt jgpt/foundation/ontology.json

The spec is a sequence of paragraphs. An admitted concept is a name followed by
a description paragraph, a lifecycle paragraph and one "Owns: ... Excludes: ..."
line; the records it defines follow it, each a CamelCase name and then pairs of
(field name, type or note). The package reads only the generated JSON, so the
repository never depends on the spec file at run time.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

_RECORD_NAME = re.compile(r"^[A-Z][A-Za-z0-9]*$")
_FIELD_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def _items(text: str) -> list[str]:
    """Split an Owns/Excludes clause into its items.

    Items that are sentences end in '.' and are joined by '., '; otherwise items
    are joined by ', ', and when they start with capitals a comma before a
    lowercase word belongs to the item ("payloads, owned by InferenceResponse").
    """
    text = text.strip().removesuffix(".")
    if "., " in text:
        parts = text.split("., ")
    elif text[:1].isupper():
        parts = re.split(r", (?=[A-Z])", text)
    else:
        parts = text.split(", ")
    return [part.strip().rstrip(".") for part in parts if part.strip()]


def _owns_excludes(line: str) -> tuple[list[str], list[str]]:
    owns, excludes = line.removeprefix("Owns: ").split(" Excludes: ", 1)
    return _items(owns), _items(excludes)


def _records(lines: list[str]) -> dict[str, list[dict[str, str]]]:
    """Read the records of one concept: a name, then (field, note) pairs."""
    records: dict[str, list[dict[str, str]]] = {}
    fields: list[dict[str, str]] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if _RECORD_NAME.match(line):
            fields = records.setdefault(line, [])
            i += 1
            continue
        if fields is None or not _FIELD_NAME.match(line):
            raise ValueError(f"unexpected line in record list: {line!r}")
        note = lines[i + 1] if i + 1 < len(lines) else ""
        fields.append({"name": line, "note": note})
        i += 2
    return records


def parse(text: str) -> list[dict]:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    starts = [i for i in range(len(lines) - 3) if lines[i + 3].startswith("Owns: ")]
    concepts = []
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(lines)
        owns, excludes = _owns_excludes(lines[start + 3])
        concepts.append(
            {
                "name": lines[start],
                "description": lines[start + 1],
                "lifecycle": lines[start + 2],
                "owns": owns,
                "excludes": excludes,
                "records": _records(lines[start + 4 : end]),
            }
        )
    return concepts


def main(argv: list[str]) -> int:
    source, target = Path(argv[0]), Path(argv[1])
    concepts = parse(source.read_text(encoding="utf-8"))
    document = {"format": "jgpt-ontology", "version": 1, "concepts": concepts}
    target.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{len(concepts)} admitted concepts -> {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
