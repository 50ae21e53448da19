"""The parent of a fine-tuning run (`jgpt train --init-from MODEL`): the artifact whose weights and tokenizer
the run starts from.

A config reads the parent's manifest only (its architecture and identities), so that checking a config
reads no weights; the run then loads the artifact, which verifies every identity, and refuses one whose
weights or tokenizer are no longer those the manifest declared when the config was read.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from jgpt.artifacts.catalog import resolve_model
from jgpt.foundation.errors import ApiError
from jgpt.foundation.json_input import read_json
from jgpt.model.architecture import Architecture, architecture_from_json

FIELD = "init_from"
IDENTITIES = ("checkpoint_sha256", "manifest_sha256", "tokenizer_sha256")


@dataclasses.dataclass(frozen=True)
class ParentModel:
    """An artifact as its manifest declares it. `given` is the catalog id or path as the run was given it."""

    given: str
    path: Path
    architecture: Architecture
    checkpoint_sha256: str
    manifest_sha256: str
    tokenizer_sha256: str | None

    def identity(self) -> dict[str, Any]:
        """What a provenance names the parent by: as given, where it lay, and its three identities."""
        return {"model": self.given, "path": str(self.path)} | {name: getattr(self, name) for name in IDENTITIES}

    def weights_identity(self) -> dict[str, Any]:
        """What the run computes from: its weights and tokenizer (part of the run's preparation hash)."""
        return {"checkpoint_sha256": self.checkpoint_sha256, "tokenizer_sha256": self.tokenizer_sha256}


def declared_parent(given: str) -> ParentModel:
    """The parent `given` names (an artifact directory or a catalog id), read from its manifest."""
    try:
        path = resolve_model(given).absolute()
    except ApiError as error:
        raise ApiError(FIELD, f"{given!r} is neither a model artifact directory nor a catalog id: {error}") from None
    except (OSError, ValueError) as error:  # a name the system cannot look up: too long, a NUL byte
        raise ApiError(FIELD, f"{given!r} cannot be read as a model artifact directory: {error}") from None
    manifest = read_json(path / "manifest.json", FIELD, allow_non_finite=True)
    if not isinstance(manifest, dict) or not all(isinstance(manifest.get(name), str) for name in IDENTITIES[:2]):
        raise ApiError(FIELD, f"{path / 'manifest.json'} is not a jgpt model manifest")
    try:
        architecture = architecture_from_json(manifest.get("architecture", {}))
    except ApiError as error:
        raise ApiError(FIELD, f"the architecture in {path / 'manifest.json'} is not one jgpt trains: {error}") from None
    tokenizer = manifest.get("tokenizer_sha256")
    return ParentModel(
        given, path, architecture, manifest["checkpoint_sha256"], manifest["manifest_sha256"],
        tokenizer if isinstance(tokenizer, str) else None,
    )  # fmt: skip


def load_parent(parent: ParentModel):
    """The parent's artifact, verified, and the one the config was checked against (a ModelArtifact)."""
    from jgpt.artifacts.catalog import load_model

    artifact = load_model(parent.given)
    for name in IDENTITIES:
        if getattr(artifact, name) != getattr(parent, name):
            raise ApiError(
                FIELD,
                f"{parent.given!r} changed while the run started: its {name} is {getattr(artifact, name)}, "
                f"not {getattr(parent, name)}",
            )
    return artifact
