"""StateManager: the keys and values of the retained states the InferenceEngine serves from, on two tiers.

Which sequences are retained, where each state is and when it moves is decided
by kvsim's KVResidency policy, the one the simulator decides with
(docs/kvsim.md, "The model"); this holds the arrays its decisions move, by
state id:

* a retained state's keys and values are stored at its exact length
  (`[layers, kv_heads, positions, head_dim]`), so its `keys.nbytes +
  values.nbytes` is `positions * kv_bytes_per_position`: the logical bytes the
  policy accounts, checkable against the arrays (`check_budget`);
* device-tier arrays are jax arrays; host-tier arrays are numpy copies. An
  offload copies a state to the host and releases its device arrays when it
  ends; a reload copies it back, and the copy belongs to the request that
  reuses it once the reload ends.

The arrays are the mutable storage of one serving run and never escape it.
"""

from __future__ import annotations

from collections.abc import Iterable

import jax
import numpy as np

from kvsim import KVCache, RetainedState

DeviceArrays = tuple[jax.Array, jax.Array]  # (keys, values)
HostArrays = tuple[np.ndarray, np.ndarray]


def nbytes(arrays: tuple | None) -> int:
    return 0 if arrays is None else sum(int(x.nbytes) for x in arrays)


def to_host(arrays: DeviceArrays) -> HostArrays:
    """A real copy in host memory (on CPU `device_get` may return a view of the device buffer)."""
    keys, values = (np.array(jax.device_get(x), copy=True) for x in arrays)
    return keys, values


def to_device(arrays: HostArrays) -> DeviceArrays:
    """A real copy on the device. On CPU `device_put` aliases an aligned numpy buffer, so the copy is
    made on the host first; `jnp.array(x, copy=True)` would compile a program per shape instead."""
    keys, values = (jax.device_put(np.array(x, copy=True)) for x in arrays)
    return keys, values


class StateManager:
    def __init__(self) -> None:
        self.device: dict[str, DeviceArrays] = {}  # states occupying the device (those being offloaded too)
        self.host: dict[str, HostArrays] = {}  # states on the host (from their offload's start to their reload's end)
        self.reloading: dict[str, DeviceArrays] = {}  # device copies of states being reloaded, not yet the request's

    def retain(self, state: RetainedState, arrays: DeviceArrays) -> None:
        """A finished request's sequence, held at its exact length, becomes a device state."""
        if nbytes(arrays) != state.size:
            raise ValueError(
                f"retained arrays hold {nbytes(arrays)} bytes for {state.positions} positions ({state.size} expected)"
            )
        self.device[state.state_id] = arrays

    def take(self, state: RetainedState) -> DeviceArrays:
        """A request reuses a device state: its arrays leave the pool with it."""
        return self.device.pop(state.state_id)

    def copy_to_host(self, state: RetainedState) -> None:
        self.host[state.state_id] = to_host(self.device[state.state_id])

    def offloaded(self, state: RetainedState) -> None:
        """The host copy is complete: the device arrays are released."""
        del self.device[state.state_id]

    def copy_to_device(self, state: RetainedState) -> None:
        self.reloading[state.state_id] = jax.block_until_ready(to_device(self.host[state.state_id]))

    def reloaded(self, state: RetainedState) -> DeviceArrays:
        """The device copy is complete: the host arrays are released and the copy leaves the pool."""
        del self.host[state.state_id]
        return self.reloading.pop(state.state_id)

    def drop(self, state: RetainedState) -> None:
        self.device.pop(state.state_id, None)
        self.host.pop(state.state_id, None)

    def measured(self) -> tuple[int, int]:
        """(device, host) bytes of the arrays the pool holds, counted from their `nbytes`."""
        return sum(map(nbytes, self.device.values())), sum(map(nbytes, self.host.values()))


def check_budget(pool: StateManager, cache: KVCache, active: Iterable[tuple[str, int, int]]) -> tuple[int, int]:
    """Check the policy's accounts (`cache`) against the arrays the pool holds; returns the measured (device,
    host) bytes.

    active: (request_id, reservation, KV bytes the request holds: its reused arrays' nbytes or its row's
    positions * kv_bytes_per_position) per admitted request. Raises AssertionError naming the broken invariant.
    """
    device, host = pool.measured()
    if device != cache.device_retained:
        raise AssertionError(f"device arrays hold {device} bytes, the pool accounts {cache.device_retained}")
    if host > cache.host_retained:
        raise AssertionError(f"host arrays hold {host} bytes, the pool accounts {cache.host_retained}")
    reserved = 0
    for request_id, reservation, held in active:
        if held > reservation:
            raise AssertionError(f"request {request_id!r} holds {held} bytes of KV, over its reservation {reservation}")
        reserved += reservation
    if reserved != cache.reserved:
        raise AssertionError(f"active reservations sum to {reserved}, the pool accounts {cache.reserved}")
    if device + reserved > cache.config.device_kv_bytes:
        raise AssertionError(
            f"device {device} + reserved {reserved} bytes > device_kv_bytes {cache.config.device_kv_bytes}"
        )
    if cache.host_retained > cache.config.host_kv_bytes:
        raise AssertionError(f"host {cache.host_retained} bytes > host_kv_bytes {cache.config.host_kv_bytes}")
    return device + reserved, host
