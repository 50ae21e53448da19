"""ModelArtifact: architecture, weights, provenance and tokenizer under verified identities.

An artifact is a directory:

    manifest.json    format, architecture, provenance, parameters, identities, assets, prompt_format
    weights/         the weights as an orbax-checkpoint PyTree checkpoint
    tokenizer.json   the tokenizer file (absent for an imported model without one)
    tokenizer_config.json, chat_template.jinja
                     an imported Hugging Face tokenizer's own companions, when it had them

Identities (DESIGN.md):
- `checkpoint_sha256`: SHA-256 of a canonical serialization of the weights (each
  tensor in sorted name order as `name dtype shape` then its little-endian bytes),
  so it names the numbers, not the container that holds them;
- `tokenizer_sha256`: SHA-256 of the tokenizer file's bytes;
- `manifest_sha256`: SHA-256 of the manifest's canonical JSON without that field.

`load_artifact` verifies all of them and every listed asset's bytes; any mismatch is
an ApiError naming the identity that failed, never a warning.

`prompt_format` declares how the model's prompts are framed (jgpt/tokenizers/prompt_format.py: chat,
chat-template or plain). A manifest written before the declaration existed has none and is read unchanged
(its bytes and identities stay): its format is implied by what the artifact is (`implied_prompt_format`:
trained on a text file -> plain; imported -> chat-template when its tokenizer has a chat template, else
plain; otherwise chat).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jgpt.foundation.errors import ApiError
from jgpt.foundation.identity import file_sha256, require_finite, sha256_json, write_atomically
from jgpt.foundation.json_input import read_json
from jgpt.foundation.output_paths import library_write, recover_replaced, replace_directory, staged
from jgpt.foundation.paths import confined
from jgpt.foundation.validation import is_integer
from jgpt.model.architecture import Architecture, architecture_from_json
from jgpt.model.weights import ModelWeights, abstract_weights, check_weights, parameter_count
from jgpt.tokenizers.prompt_format import FIELD as PROMPT_FORMAT
from jgpt.tokenizers.prompt_format import check_fits, check_prompt_format, has_chat_template, implied_prompt_format
from jgpt.tokenizers.tokenizer import Tokenizer
from jgpt.tokenizers.tokenizer_file import load_tokenizer

FORMAT = "jgpt-artifact-v1"
WEIGHT_FORMAT = "orbax-checkpoint"
TOKENIZER_FORMAT = "tokenizers-json"
MANIFEST, WEIGHTS, TOKENIZER = "manifest.json", "weights", "tokenizer.json"
# A Hugging Face tokenizer's own files beside tokenizer.json (jgpt/tokenizers/hf_tokenizer.py), listed assets like it.
TOKENIZER_COMPANIONS = ("tokenizer_config.json", "chat_template.jinja")


def checkpoint_sha256(weights: ModelWeights) -> str:
    """Canonical identity of the weights, independent of the on-disk container."""
    digest = hashlib.sha256(b"jgpt-weights-v1\n")
    for name, tensor in weights.as_dict().items():
        array = np.asarray(tensor)
        little_endian = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
        shape = ",".join(map(str, array.shape))
        digest.update(f"{name} {array.dtype.name} [{shape}]\n".encode())
        digest.update(little_endian.tobytes())
    return digest.hexdigest()


@dataclasses.dataclass(frozen=True)
class ModelAsset:
    """One file of an artifact: its path relative to the artifact, sha256 and size."""

    path: str
    sha256: str
    bytes: int

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ModelArtifact:
    path: Path
    architecture: Architecture
    weights: ModelWeights
    provenance: Mapping[str, Any]  # InitializationProvenance or TrainingProvenance as JSON
    checkpoint_sha256: str
    tokenizer_sha256: str | None
    manifest_sha256: str
    assets: tuple[ModelAsset, ...]
    prompt_format: str  # declared by the manifest, or implied for one written before the declaration
    format: str = FORMAT

    @property
    def tokenizer_path(self) -> Path | None:
        return None if self.tokenizer_sha256 is None else self.path / TOKENIZER

    def tokenizer(self) -> Tokenizer:
        """The artifact's tokenizer; a model saved without one reads pure bytes."""
        return Tokenizer.bytes_only() if self.tokenizer_path is None else load_tokenizer(self.tokenizer_path)

    @property
    def parameters(self) -> int:
        return parameter_count(self.architecture)

    def reference(self) -> dict[str, Any]:
        """The lightweight ModelArtifactReference that records and KV states carry."""
        return {
            "checkpoint_sha256": self.checkpoint_sha256,
            "tokenizer_sha256": self.tokenizer_sha256,
            "architecture": self.architecture.to_json(),
        }


def _provenance_json(provenance: Any) -> dict[str, Any]:
    document = provenance.to_json() if hasattr(provenance, "to_json") else provenance
    if not isinstance(document, Mapping) or "kind" not in document:
        raise ApiError("provenance", "must be a provenance record (a JSON object with a kind)")
    return dict(document)


def _assets(directory: Path) -> list[ModelAsset]:
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)
    return [ModelAsset(p.relative_to(directory).as_posix(), file_sha256(p), p.stat().st_size) for p in files]


def _save_weights(directory: Path, weights: ModelWeights) -> None:
    import orbax.checkpoint as ocp

    tensors = {name: np.asarray(tensor) for name, tensor in weights.as_dict().items()}
    # One process's write: of a run over several processes (jax.distributed) process 0 alone saves the
    # artifact, and orbax would wait at its barriers for the others.
    alone = ocp.options.MultiprocessingOptions(primary_host=jax.process_index(), active_processes={jax.process_index()})
    with library_write(), ocp.StandardCheckpointer(multiprocessing_options=alone) as checkpointer:
        checkpointer.save(directory, tensors)
        checkpointer.wait_until_finished()


def _restore_weights(directory: Path, architecture: Architecture) -> ModelWeights:
    """The weights on the default device. A checkpoint in orbax's OCDBT layout (what `_save_weights` writes)
    is read with tensorstore directly: importing orbax and running its restore took a third of a second of
    `jgpt generate`'s start-up. Any other layout is orbax's to read. load_artifact checks checkpoint_sha256
    either way."""
    target = abstract_weights(architecture).as_dict()
    tensors = _read_ocdbt(directory, target)
    if tensors is None:
        import orbax.checkpoint as ocp

        with ocp.StandardCheckpointer() as checkpointer:
            tensors = checkpointer.restore(directory, target)
    # device_put, not jnp.asarray, which compiles a copy program per shape.
    return ModelWeights.from_dict({name: jax.device_put(tensor) for name, tensor in tensors.items()})


def _read_ocdbt(directory: Path, target: Mapping[str, Any]) -> dict[str, np.ndarray] | None:
    """Each tensor of `target` from orbax's OCDBT key-value store (one zarr array per name), or None when
    the checkpoint is laid out otherwise or holds another shape or dtype."""
    if not (directory / "manifest.ocdbt").is_file():
        return None
    import tensorstore as ts

    store = {"driver": "ocdbt", "base": directory.as_uri() + "/"}
    tensors = {}
    for name, expected in target.items():
        try:
            array = ts.open({"driver": "zarr", "kvstore": store | {"path": name}}, open=True, read=True).result()
        except ValueError:  # not a zarr array at that key (another orbax layout)
            return None
        if tuple(array.shape) != tuple(expected.shape) or array.dtype.numpy_dtype != expected.dtype:
            return None
        tensors[name] = array.read().result()
    return tensors


def save_artifact(
    path: str | os.PathLike,
    architecture: Architecture,
    weights: ModelWeights,
    provenance: Any,
    tokenizer: Any = None,
    *,
    prompt_format: str | None = None,
    overwrite: bool = False,
) -> ModelArtifact:
    """Write an artifact directory atomically (staged next to `path`, then renamed).

    `tokenizer` is a Tokenizer (anything with `.save(path)`), a path to a tokenizer
    file, or None for a model without one. `provenance` is an InitializationProvenance,
    a TrainingProvenance, or its JSON object. `prompt_format` (chat, chat-template or plain) is
    written into the manifest; None writes the one implied by the provenance and the tokenizer's chat template.
    """
    path = Path(path).absolute()  # orbax accepts absolute paths only
    check_weights(weights, architecture)
    recover_replaced(path, _is_artifact)
    if path.exists() or path.is_symlink():
        if not overwrite:
            raise ApiError("out", f"{path} already exists")
        _require_replaceable(path)
    provenance_json = _provenance_json(provenance)
    with staged(path, "out") as staging:
        _save_weights(staging / WEIGHTS, weights)
        tokenizer_sha256 = None
        if tokenizer is not None:
            if hasattr(tokenizer, "save"):
                tokenizer.save(staging / TOKENIZER)
            else:
                shutil.copyfile(tokenizer, staging / TOKENIZER)
            tokenizer_sha256 = file_sha256(staging / TOKENIZER)
        prompt_format = _prompt_format(prompt_format, provenance_json, staging, tokenizer)
        manifest = {
            "format": FORMAT,
            "architecture": architecture.to_json(),
            "provenance": provenance_json,
            "parameters": parameter_count(architecture),
            "checkpoint_sha256": checkpoint_sha256(weights),
            "tokenizer_sha256": tokenizer_sha256,
            "weight_format": WEIGHT_FORMAT,
            "tokenizer_format": None if tokenizer is None else TOKENIZER_FORMAT,
            "assets": [asset.to_json() for asset in _assets(staging)],
            PROMPT_FORMAT: prompt_format,
        }
        manifest["manifest_sha256"] = sha256_json(manifest)
        write_atomically(staging / MANIFEST, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())
        replace_directory(staging, path)
    return load_artifact(path)


def _prompt_format(declared: str | None, provenance: Mapping[str, Any], directory: Path, tokenizer: Any) -> str:
    """The format to declare: the one given, checked against the tokenizer (`save_artifact`'s, saved in
    `directory`), or the one implied by the provenance and the tokenizer files."""
    if declared is None:
        return implied_prompt_format(provenance, has_chat_template(directory))
    check_prompt_format(declared)
    if tokenizer is None:
        tokenizer = Tokenizer.bytes_only()
    elif not hasattr(tokenizer, "save"):
        tokenizer = load_tokenizer(directory / TOKENIZER)
    check_fits(declared, tokenizer)
    return declared


def _require_replaceable(path: Path) -> None:
    """`--overwrite` replaces a jgpt artifact and nothing else: never a file, nor a directory of other things."""
    if path.is_symlink() or not path.is_dir() or not (path / MANIFEST).is_file():
        raise ApiError("out", f"{path} exists and is not a jgpt model artifact; --overwrite replaces only an artifact")
    manifest = read_json(path / MANIFEST, "out", allow_non_finite=True)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ApiError("out", f"{path / MANIFEST} is not a {FORMAT} manifest; --overwrite replaces only an artifact")
    parts = (MANIFEST, WEIGHTS, TOKENIZER, *TOKENIZER_COMPANIONS)
    foreign = sorted(entry.name for entry in path.iterdir() if entry.name not in parts)
    if foreign:
        raise ApiError("out", f"{path} also holds {foreign[0]!r}, which is not part of an artifact; not replacing it")


def _is_artifact(path: Path) -> bool:
    try:
        _require_replaceable(path)
    except (ApiError, OSError):
        return False
    return True


def _read_manifest(path: Path) -> dict[str, Any]:
    if not (path / MANIFEST).is_file():
        raise ApiError("path", f"{path} is not a model artifact (no {MANIFEST})")
    manifest = read_json(path / MANIFEST, "manifest_sha256", allow_non_finite=True)
    if not isinstance(manifest, dict):
        raise ApiError("manifest_sha256", f"{path / MANIFEST} is not a JSON object")
    if unknown := set(manifest) - MANIFEST_FIELDS:  # first: a field outside the format is named by the format
        raise ApiError("format", f"{FORMAT} has no manifest fields {sorted(unknown)}")
    for name, value in manifest.items():
        require_finite(value, name)  # before hashing: the canonical form has no NaN
    claimed = manifest.pop("manifest_sha256", None)
    actual = sha256_json(manifest)
    if claimed != actual:
        raise ApiError(
            "manifest_sha256", f"{path / MANIFEST} was changed: content hashes to {actual}, it claims {claimed}"
        )
    if manifest.get("format") != FORMAT:
        raise ApiError("format", f"{manifest.get('format')!r} is not {FORMAT!r}")
    _check_manifest(manifest)
    manifest["manifest_sha256"] = claimed
    return manifest


# What save_artifact writes (prompt_format only since it was declared; older manifests lack it).
MANIFEST_FIELDS = {
    "format", "architecture", "provenance", "parameters", "checkpoint_sha256", "tokenizer_sha256", "weight_format",
    "tokenizer_format", "assets", PROMPT_FORMAT, "manifest_sha256",
}  # fmt: skip


def _check_manifest(manifest: Mapping[str, Any]) -> None:
    """A sealed manifest can still be hand-made: every field must have the type the loader relies on."""
    for name in ("architecture", "provenance", "parameters", "checkpoint_sha256", "tokenizer_sha256", "assets"):
        if name not in manifest:
            raise ApiError(name, "is required in a model artifact's manifest")
    try:
        architecture = architecture_from_json(manifest["architecture"])
    except ApiError as error:
        raise ApiError(f"architecture.{error.field}", error.reason) from None
    if not is_integer(manifest["parameters"]) or manifest["parameters"] != parameter_count(architecture):
        raise ApiError("parameters", f"must be the architecture's parameter count {parameter_count(architecture)}")
    _provenance_json(manifest["provenance"])
    _require_sha256(manifest["checkpoint_sha256"], "checkpoint_sha256")
    if manifest["tokenizer_sha256"] is not None:
        _require_sha256(manifest["tokenizer_sha256"], "tokenizer_sha256")
    if PROMPT_FORMAT in manifest:
        check_prompt_format(manifest[PROMPT_FORMAT])
    if not isinstance(manifest["assets"], list):
        raise ApiError("assets", "must be a list of ModelAssets")
    for n, asset in enumerate(manifest["assets"]):
        if not isinstance(asset, dict) or set(asset) != {"path", "sha256", "bytes"}:
            raise ApiError(f"assets[{n}]", "must be a ModelAsset: an object with exactly path, sha256 and bytes")
        _require_sha256(asset["sha256"], f"assets[{n}].sha256")
        if not is_integer(asset["bytes"]) or asset["bytes"] < 0:
            raise ApiError(f"assets[{n}].bytes", f"must be a non-negative integer, got {asset['bytes']!r}")


def _require_sha256(value: Any, field: str) -> None:
    if not isinstance(value, str) or len(value) != 64 or value.strip("0123456789abcdef"):
        raise ApiError(field, f"must be 64 lowercase hexadecimal digits, got {value!r}")


def _verify_assets(path: Path, manifest: Mapping[str, Any]) -> tuple[ModelAsset, ...]:
    assets = tuple(ModelAsset(**asset) for asset in manifest["assets"])
    # Every path is confined before any is looked at, so a refusal never tells whether some file exists.
    files = [confined(path, asset.path, f"assets[{n}].path") for n, asset in enumerate(assets)]
    for asset, file in zip(assets, files):
        identity = "tokenizer_sha256" if asset.path in (TOKENIZER, *TOKENIZER_COMPANIONS) else "checkpoint_sha256"
        if not file.is_file():
            raise ApiError(identity, f"{asset.path} is missing from {path}")
        if file.stat().st_size != asset.bytes or file_sha256(file) != asset.sha256:
            raise ApiError(
                identity, f"{asset.path} in {path} was changed: it no longer has its recorded sha256 {asset.sha256}"
            )
    return assets


def _refuse_unlisted(path: Path, weights: Path, assets: tuple[ModelAsset, ...]) -> None:
    """Orbax reads whatever lies under weights/: every file there must be a verified asset, and no
    symbolic link to a directory may hide one (os.walk does not follow them, and lists them)."""
    listed = {asset.path for asset in assets}
    for root, directories, files in os.walk(weights):
        for name in [*files, *(d for d in directories if os.path.islink(os.path.join(root, d)))]:
            relative = (WEIGHTS / Path(root, name).relative_to(weights)).as_posix()
            if relative not in listed:
                raise ApiError("checkpoint_sha256", f"{relative} in {path} is not an asset its manifest lists")


def load_artifact(path: str | os.PathLike) -> ModelArtifact:
    """Read an artifact, verifying manifest, assets, tokenizer and the canonical weights identity."""
    path = Path(path).absolute()
    manifest = _read_manifest(path)
    assets = _verify_assets(path, manifest)
    tokenizer_sha256 = manifest["tokenizer_sha256"]
    tokenizer = confined(path, TOKENIZER, "tokenizer_sha256")
    if tokenizer_sha256 is not None and (not tokenizer.is_file() or file_sha256(tokenizer) != tokenizer_sha256):
        raise ApiError("tokenizer_sha256", f"{path / TOKENIZER} does not hash to {tokenizer_sha256}")
    architecture = architecture_from_json(manifest["architecture"])
    weights_directory = confined(path, WEIGHTS, "checkpoint_sha256")
    _refuse_unlisted(path, weights_directory, assets)
    # The tokenizer reads its companions beside tokenizer.json: only verified ones may be there.
    if unlisted := [
        name
        for name in TOKENIZER_COMPANIONS
        if os.path.lexists(path / name) and name not in {asset.path for asset in assets}
    ]:
        raise ApiError("tokenizer_sha256", f"{unlisted[0]} in {path} is not an asset its manifest lists")
    try:
        weights = _restore_weights(weights_directory, architecture)
    except Exception as error:  # orbax and tensorstore raise many types for unreadable data
        raise ApiError("checkpoint_sha256", f"weights in {path} cannot be read: {error}") from None
    actual = checkpoint_sha256(weights)
    if actual != manifest["checkpoint_sha256"]:
        raise ApiError(
            "checkpoint_sha256", f"weights in {path} hash to {actual}, manifest says {manifest['checkpoint_sha256']}"
        )
    declared = manifest.get(PROMPT_FORMAT)
    return ModelArtifact(
        path=path,
        architecture=architecture,
        weights=weights,
        provenance=manifest["provenance"],
        checkpoint_sha256=actual,
        tokenizer_sha256=tokenizer_sha256,
        manifest_sha256=manifest["manifest_sha256"],
        assets=assets,
        prompt_format=declared or implied_prompt_format(manifest["provenance"], has_chat_template(path)),
    )
