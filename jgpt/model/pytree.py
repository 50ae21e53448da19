"""Immutable dataclasses that are JAX pytrees: `@pytree.dataclass` and `pytree.field(pytree_node=False)`.

The same contract as `flax.struct` (frozen, `.replace(**changes)`, fields with `pytree_node=False` are
static: part of the tree's structure, not leaves), without importing flax: `from flax import struct`
imports all of flax.linen, a quarter of a second of every `jgpt` command's start-up.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, TypeVar, cast, dataclass_transform

import jax

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")
D = TypeVar("D", bound="DataclassInstance")


def field(pytree_node: bool = True, **kwargs: Any) -> Any:
    """A dataclass field; `pytree_node=False` makes it static metadata instead of a leaf."""
    metadata = dict(kwargs.pop("metadata", None) or {}) | {"pytree_node": pytree_node}
    return dataclasses.field(metadata=metadata, **kwargs)


class Replaceable:
    """Base of a decorated class whose `replace` is called where the type checker reads it.

    The decorator gives every class this `replace`; a decorator cannot tell the checker that it adds a
    method, a base class can.
    """

    def replace(self: D, **changes: Any) -> D:
        """A copy with `changes` to its fields."""
        return dataclasses.replace(self, **changes)


# Tells the type checker that the decorator makes a frozen dataclass whose fields may be declared with
# `field`, so that it knows the constructor and the fields of every decorated class.
@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def dataclass(cls: type[T]) -> type[T]:
    """`cls` as a frozen dataclass registered as a pytree, with `replace(**changes)`."""
    cls = dataclasses.dataclass(frozen=True)(cls)
    # What dataclasses.dataclass returns is a dataclass; its signature says only type[T].
    fields = dataclasses.fields(cast("type[DataclassInstance]", cls))
    data = [f.name for f in fields if f.metadata.get("pytree_node", True)]
    meta = [f.name for f in fields if not f.metadata.get("pytree_node", True)]
    # setattr: the class's type has no `replace` for the checker until it is added here, at run time.
    setattr(cls, "replace", Replaceable.replace)  # noqa: B010
    jax.tree_util.register_dataclass(cls, data_fields=data, meta_fields=meta)
    return cls
