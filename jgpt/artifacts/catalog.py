"""ModelCatalog: the models a checkout knows about, and where their artifacts are stored.

`checkpoints/catalog.json` holds a ModelStorage `base_url` (relative to the catalog
file, or an http(s) prefix) and ModelDescriptors. A descriptor's `weights` asset
names the artifact directory under `base_url` with the artifact's canonical
`checkpoint_sha256`; its `tokenizer` asset names the tokenizer file. At most one
model has role "default". Nothing is downloaded: an http(s) store resolves only to
artifacts already present in the local cache. An installed wheel carries the same
files as `jgpt/checkpoints/`, verified by the same hashes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jgpt.foundation.errors import ApiError
from jgpt.foundation.identity import output_mode, require_finite
from jgpt.foundation.json_input import read_json
from jgpt.foundation.paths import confined
from jgpt.foundation.validation import integer, integers


def shipped_catalog() -> Path:
    """The catalog of the models jgpt ships: in an installed wheel, the package jgpt.checkpoints (which
    pyproject.toml maps from the checkout's checkpoints/); in a checkout, checkpoints/ itself."""
    package = Path(__file__).resolve().parents[1]
    installed = package / "checkpoints" / "catalog.json"
    return installed if installed.is_file() else package.parent / "checkpoints" / "catalog.json"


DEFAULT_CATALOG = shipped_catalog()
CACHE_ENV = "JGPT_CACHE"
DEFAULT_ROLE = "default"


def _cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "jgpt"))


@dataclasses.dataclass(frozen=True)
class ModelDescriptor:
    id: str
    label: str
    role: str | None
    parameters: int
    architecture: Mapping[str, Any]
    weights: Mapping[str, Any]  # ModelAsset: artifact directory, checkpoint_sha256, weight bytes
    tokenizer: Mapping[str, Any] | None  # ModelAsset of tokenizer.json
    seed: int | None = None
    inspection: str | None = None
    stop_ids: tuple[int, ...] = ()
    normalization: str | None = None
    provenance: str | None = None
    weight_format: str = "orbax-checkpoint"
    tokenizer_format: str | None = "tokenizers-json"

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id.strip():
            raise ApiError("id", f"must be a non-empty string, got {self.id!r}")
        _require_type("label", self.label, str)
        if self.role not in (None, DEFAULT_ROLE):
            raise ApiError("role", f"must be null or {DEFAULT_ROLE!r}, got {self.role!r}")
        integer(self.parameters, "parameters", minimum=1)
        _require_type("architecture", self.architecture, Mapping)
        require_finite(dict(self.architecture), "architecture")
        _check_asset("weights", self.weights)
        if self.tokenizer is not None:
            _check_asset("tokenizer", self.tokenizer)
        if self.seed is not None:
            integer(self.seed, "seed", minimum=None)
        for name in ("inspection", "normalization", "provenance", "tokenizer_format"):
            if getattr(self, name) is not None:
                _require_type(name, getattr(self, name), str)
        _require_type("weight_format", self.weight_format, str)
        integers(list(self.stop_ids), "stop_ids")

    def to_json(self) -> dict[str, Any]:
        document = dataclasses.asdict(self)
        document["stop_ids"] = list(self.stop_ids)
        return document

    @classmethod
    def from_json(cls, document: Any, where: str) -> ModelDescriptor:
        if not isinstance(document, Mapping):
            raise ApiError(where, "must be a JSON object")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(document) - set(fields))
        if unknown:
            raise ApiError(f"{where}.{unknown[0]}", "is not a ModelDescriptor field")
        for name, field in fields.items():
            if field.default is dataclasses.MISSING and name not in document:
                raise ApiError(f"{where}.{name}", "is required")
        stop_ids = document.get("stop_ids", [])
        if not isinstance(stop_ids, list):
            raise ApiError(f"{where}.stop_ids", f"must be a list of token ids, got {stop_ids!r}")
        try:
            return cls(**{**document, "stop_ids": tuple(stop_ids)})
        except ApiError as error:
            raise ApiError(f"{where}.{error.field}", error.reason) from None


def _require_type(field: str, value: Any, kind: type) -> None:
    if not isinstance(value, kind):
        raise ApiError(field, f"must be a {'JSON object' if kind is Mapping else kind.__name__}, got {value!r}")


def _check_asset(field: str, asset: Any) -> None:
    """A ModelAsset as the catalog names it: relative path, SHA-256 (the cache key of remote storage), bytes."""
    if not isinstance(asset, Mapping) or {"path", "sha256", "bytes"} - set(asset):
        raise ApiError(field, "must be a ModelAsset with path, sha256 and bytes")
    if not isinstance(asset["path"], str) or not asset["path"]:
        raise ApiError(f"{field}.path", f"must be a non-empty relative path, got {asset['path']!r}")
    sha256 = asset["sha256"]
    if not isinstance(sha256, str) or len(sha256) != 64 or sha256.strip("0123456789abcdef"):
        raise ApiError(f"{field}.sha256", f"must be 64 lowercase hexadecimal digits, got {sha256!r}")
    integer(asset["bytes"], f"{field}.bytes")


@dataclasses.dataclass(frozen=True)
class ModelCatalog:
    path: Path
    base_url: str
    models: tuple[ModelDescriptor, ...]

    @property
    def default(self) -> ModelDescriptor | None:
        return next((m for m in self.models if m.role == DEFAULT_ROLE), None)

    def default_id(self) -> str:
        """The id of the model with role "default"; without one, an ApiError saying how to name a model."""
        if self.default is None:
            raise ApiError("model", f"{self.path} has no default model yet; name one with --model ID|PATH")
        return self.default.id

    def find(self, model_id: str) -> ModelDescriptor:
        for model in self.models:
            if model.id == model_id:
                return model
        known = ", ".join(m.id for m in self.models) or "none"
        raise ApiError("model_id", f"{model_id!r} is not in {self.path} (known: {known})")

    def artifact_dir(self, model: ModelDescriptor) -> Path:
        """Where the model's artifact lies on this machine."""
        if self.base_url.startswith(("http://", "https://")):
            cached = confined(_cache_dir() / "models", model.weights["sha256"], f"{model.id}.weights.sha256")
            if not cached.is_dir():
                raise ApiError(
                    "base_url",
                    f"{model.id!r} is stored at {self.base_url}, and jgpt downloads nothing; "
                    f"place the artifact at {cached} to use it",
                )
            return cached
        storage = confined(self.path.parent, self.base_url, "storage.base_url")
        return confined(storage, model.weights["path"], f"{model.id}.weights.path")

    def to_json(self) -> dict[str, Any]:
        return {"storage": {"base_url": self.base_url}, "models": [m.to_json() for m in self.models]}


def read_catalog(path: str | os.PathLike = DEFAULT_CATALOG) -> ModelCatalog:
    path = Path(path)
    document = read_json(path, "catalog", allow_non_finite=True)  # a NaN is refused naming its field
    storage = document.get("storage") if isinstance(document, Mapping) else None
    if not isinstance(storage, Mapping) or not isinstance(storage.get("base_url"), str):
        raise ApiError("storage.base_url", f"{path} must give storage.base_url as a string")
    models = document.get("models")
    if not isinstance(models, list):
        raise ApiError("models", f"{path} must give models as an array")
    descriptors = tuple(ModelDescriptor.from_json(m, f"models[{i}]") for i, m in enumerate(models))
    _check_unique(descriptors)
    return ModelCatalog(path=path, base_url=storage["base_url"], models=descriptors)


def _check_unique(models: tuple[ModelDescriptor, ...]) -> None:
    ids = [m.id for m in models]
    duplicated = sorted({i for i in ids if ids.count(i) > 1})
    if duplicated:
        raise ApiError("models.id", f"{duplicated[0]!r} appears more than once")
    if sum(m.role == DEFAULT_ROLE for m in models) > 1:
        raise ApiError("models.role", f"more than one model has role {DEFAULT_ROLE!r}")


def write_catalog(catalog: ModelCatalog) -> None:
    """Write the catalog atomically (temp file in the same directory, then rename)."""
    _check_unique(catalog.models)
    text = json.dumps(catalog.to_json(), indent=2) + "\n"
    handle, temp = tempfile.mkstemp(prefix=f".{catalog.path.name}.", dir=catalog.path.parent)
    try:
        with os.fdopen(handle, "w") as f:
            f.write(text)
        os.chmod(temp, output_mode(catalog.path))  # mkstemp creates 0600 whatever the umask
        os.replace(temp, catalog.path)
    except BaseException:
        os.unlink(temp)
        raise


def describe(
    artifact, catalog: ModelCatalog, *, model_id: str, label: str, role: str | None = None, **details
) -> ModelDescriptor:
    """A descriptor for a loaded ModelArtifact stored under the catalog's (relative) base_url."""
    root = (catalog.path.parent / catalog.base_url).resolve()
    try:
        directory = artifact.path.resolve().relative_to(root).as_posix()
    except ValueError:
        raise ApiError("artifact", f"{artifact.path} is not under the catalog's storage {root}") from None
    weight_bytes = sum(a.bytes for a in artifact.assets if a.path.startswith("weights/"))
    tokenizer = next((a for a in artifact.assets if a.path == "tokenizer.json"), None)
    return ModelDescriptor(
        id=model_id,
        label=label,
        role=role,
        parameters=artifact.parameters,
        architecture=artifact.architecture.to_json(),
        weights={"path": directory, "sha256": artifact.checkpoint_sha256, "bytes": weight_bytes},
        tokenizer=None if tokenizer is None else {**tokenizer.to_json(), "path": f"{directory}/{tokenizer.path}"},
        seed=artifact.provenance.get("seed"),
        provenance=artifact.provenance.get("kind"),
        tokenizer_format=None if tokenizer is None else "tokenizers-json",
        **details,
    )


def add_model(catalog: ModelCatalog, model: ModelDescriptor) -> ModelCatalog:
    """A catalog with `model` added (replacing one with the same id); a new default demotes the old one."""
    others = tuple(
        dataclasses.replace(m, role=None) if model.role == DEFAULT_ROLE and m.role == DEFAULT_ROLE else m
        for m in catalog.models
        if m.id != model.id
    )
    return dataclasses.replace(catalog, models=(*others, model))


def resolve_model(id_or_path: str | os.PathLike, catalog_path: str | os.PathLike = DEFAULT_CATALOG) -> Path:
    """A local artifact directory for a catalog id, or for a path to an artifact directory."""
    candidate = Path(id_or_path)
    if (candidate / "manifest.json").is_file():
        return candidate
    catalog = read_catalog(catalog_path)
    return catalog.artifact_dir(catalog.find(str(id_or_path)))


def declared_identity(
    id_or_path: str | os.PathLike, catalog_path: str | os.PathLike = DEFAULT_CATALOG
) -> tuple[str, dict[str, Any]] | None:
    """(where, {checkpoint_sha256, tokenizer_sha256}) that an artifact directory's manifest or the catalog
    declares for a model, reading no weights; None when neither is on this machine."""
    candidate = Path(id_or_path)
    if (candidate / "manifest.json").is_file():
        manifest = read_json(candidate / "manifest.json", "manifest_sha256", allow_non_finite=True)
        manifest = manifest if isinstance(manifest, dict) else {}
        return str(candidate / "manifest.json"), {
            name: manifest.get(name) for name in ("checkpoint_sha256", "tokenizer_sha256")
        }
    catalog = read_catalog(catalog_path)
    model = next((m for m in catalog.models if m.id == str(id_or_path)), None)
    if model is None:
        return None
    tokenizer = None if model.tokenizer is None else model.tokenizer["sha256"]
    return f"{catalog.path} ({model.id!r})", {
        "checkpoint_sha256": model.weights["sha256"],
        "tokenizer_sha256": tokenizer,
    }


def load_model(id_or_path: str | os.PathLike, catalog_path: str | os.PathLike = DEFAULT_CATALOG):
    """Load and verify an artifact; through the catalog, also check it is the one the catalog names."""
    from jgpt.artifacts.artifact import load_artifact

    candidate = Path(id_or_path)
    if (candidate / "manifest.json").is_file():
        return load_artifact(candidate)
    catalog = read_catalog(catalog_path)
    model = catalog.find(str(id_or_path))
    artifact = load_artifact(catalog.artifact_dir(model))
    if artifact.checkpoint_sha256 != model.weights["sha256"]:
        raise ApiError(
            "checkpoint_sha256",
            f"{model.id!r}: artifact has {artifact.checkpoint_sha256}, catalog names {model.weights['sha256']}",
        )
    expected_tokenizer = None if model.tokenizer is None else model.tokenizer["sha256"]
    if artifact.tokenizer_sha256 != expected_tokenizer:
        raise ApiError(
            "tokenizer_sha256",
            f"{model.id!r}: artifact has {artifact.tokenizer_sha256}, catalog names {expected_tokenizer}",
        )
    return artifact
