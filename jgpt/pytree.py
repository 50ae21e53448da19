"""Immutable dataclasses that are JAX pytrees: `@pytree.dataclass` and `pytree.field(pytree_node=False)`.

The same contract as `flax.struct` (frozen, `.replace(**changes)`, fields with `pytree_node=False` are
static: part of the tree's structure, not leaves), without importing flax: `from flax import struct`
imports all of flax.linen, a quarter of a second of every `jgpt` command's start-up.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import jax

T = TypeVar("T")


def field(pytree_node: bool = True, **kwargs: Any) -> Any:
    """A dataclass field; `pytree_node=False` makes it static metadata instead of a leaf."""
    metadata = dict(kwargs.pop("metadata", None) or {}) | {"pytree_node": pytree_node}
    return dataclasses.field(metadata=metadata, **kwargs)


def dataclass(cls: type[T]) -> type[T]:
    """`cls` as a frozen dataclass registered as a pytree, with `replace(**changes)`."""
    cls = dataclasses.dataclass(frozen=True)(cls)
    fields = dataclasses.fields(cls)
    data = [f.name for f in fields if f.metadata.get("pytree_node", True)]
    meta = [f.name for f in fields if not f.metadata.get("pytree_node", True)]
    cls.replace = lambda self, **changes: dataclasses.replace(self, **changes)
    jax.tree_util.register_dataclass(cls, data_fields=data, meta_fields=meta)
    return cls
