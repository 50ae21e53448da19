"""StateManager: the KV state pool the InferenceEngine serves from, with a device and a host tier.

It keeps kvsim's KVCache rules (docs/kvsim.md, "The model") over real arrays:

* a retained state is the keys and values of an exact token sequence, stored at
  its exact length (`[layers, kv_heads, positions, head_dim]`), so its
  `keys.nbytes + values.nbytes` is `positions * kv_bytes_per_position`: the
  logical bytes kvsim accounts, checkable against the arrays;
* a lookup finds the longest retained sequence that is a proper prefix of the
  prompt; a hit takes the state (it leaves the pool, so no two requests share it);
* device bytes = active reservations + states on the device (a state being
  offloaded occupies the device until its transfer ends); host bytes = states on
  the host, including ones being offloaded to or reloaded from it.

Device-tier arrays are jax arrays; host-tier arrays are numpy copies. The pool
is the mutable bookkeeping of one serving run and never escapes it.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, insort
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import jax
import numpy as np

from kvsim import KVCacheConfig

DEVICE, OFFLOADING, HOST, RELOADING = "device", "offloading", "host", "reloading"


def token_key(ids: Sequence[int]) -> bytes:
    """Token ids as fixed-width bytes, so a prefix of ids is a prefix of the key (4 bytes per id)."""
    return array("I", ids).tobytes()


@dataclass(eq=False, slots=True)
class RetainedState:
    state_id: str
    key: bytes
    positions: int
    size: int  # logical bytes: positions * kv_bytes_per_position
    origin: str  # the request whose computation produced it
    tier: str
    device: tuple[jax.Array, jax.Array] | None  # (keys, values) on the device, while it occupies the device
    host: tuple[np.ndarray, np.ndarray] | None = None  # (keys, values) copied to the host
    taken: bool = False  # claimed by a request

    @property
    def token_ids(self) -> tuple[int, ...]:
        return tuple(array("I", self.key))


def nbytes(arrays: tuple | None) -> int:
    return 0 if arrays is None else sum(int(x.nbytes) for x in arrays)


def to_host(arrays: tuple[jax.Array, jax.Array]) -> tuple[np.ndarray, np.ndarray]:
    """A real copy in host memory (on CPU `device_get` may return a view of the device buffer)."""
    keys, values = (np.array(jax.device_get(x), copy=True) for x in arrays)
    return keys, values


def to_device(arrays: tuple[np.ndarray, np.ndarray]) -> tuple[jax.Array, jax.Array]:
    """A real copy on the device. On CPU `device_put` aliases an aligned numpy buffer, so the copy is
    made on the host first; `jnp.array(x, copy=True)` would compile a program per shape instead."""
    return tuple(jax.device_put(np.array(x, copy=True)) for x in arrays)


class StateManager:
    def __init__(self, config: KVCacheConfig, kv_bytes_per_position: int):
        self.config = config
        self.kv_bytes_per_position = kv_bytes_per_position
        self.reserved = 0  # bytes of active requests' reservations
        self.device_retained = 0  # retained states occupying the device (incl. those being offloaded)
        self.host_retained = 0
        self.offloading_bytes = 0  # device bytes that free when in-flight offloads end
        self.device_lru: OrderedDict[str, RetainedState] = OrderedDict()  # least recent first
        self.host_lru: OrderedDict[str, RetainedState] = OrderedDict()
        self.device_lru_bytes = 0
        self.host_lru_bytes = 0
        self.states: dict[str, RetainedState] = {}  # every state still holding arrays in the pool
        self._index: dict[bytes, RetainedState] = {}
        self._lengths: list[int] = []  # distinct key lengths in the index, ascending
        self._length_counts: dict[int, int] = {}
        self._next_state = 0

    # -- occupancy -------------------------------------------------------

    def device_free(self) -> int:
        return self.config.device_kv_bytes - self.reserved - self.device_retained

    def host_free(self) -> int:
        return self.config.host_kv_bytes - self.host_retained

    def measured(self) -> tuple[int, int]:
        """(device, host) bytes of the arrays the pool holds, counted from their `nbytes`."""
        device = sum(nbytes(s.device) for s in self.states.values() if s.tier in (DEVICE, OFFLOADING))
        host = sum(nbytes(s.host) for s in self.states.values() if s.tier != DEVICE)
        return device, host

    # -- lookup ----------------------------------------------------------

    def lookup(self, prompt_key: bytes) -> RetainedState | None:
        """The longest retained state whose sequence is a proper prefix of the prompt."""
        index, lengths = self._index, self._lengths
        for i in range(bisect_left(lengths, len(prompt_key)) - 1, -1, -1):
            state = index.get(prompt_key[: lengths[i]])
            if state is not None:
                return state
        return None

    def take(self, state: RetainedState) -> None:
        """A request claims the state: it leaves the index and can no longer be evicted."""
        self._unindex(state)
        state.taken = True
        if state.tier == DEVICE:
            del self.device_lru[state.state_id]
            del self.states[state.state_id]
            self.device_lru_bytes -= state.size
            self.device_retained -= state.size  # the bytes become part of the request's reservation
        elif state.tier == HOST:
            del self.host_lru[state.state_id]
            self.host_lru_bytes -= state.size
            state.tier = RELOADING

    def has(self, key: bytes) -> bool:
        return key in self._index

    def retain(self, key: bytes, origin: str, arrays: tuple[jax.Array, jax.Array]) -> RetainedState:
        """A finished request's sequence, held at its exact length, becomes the most recent device state."""
        positions = len(key) // 4
        size = positions * self.kv_bytes_per_position
        if nbytes(arrays) != size:
            raise ValueError(f"retained arrays hold {nbytes(arrays)} bytes for {positions} positions ({size} expected)")
        state = RetainedState(f"s{self._next_state}", key, positions, size, origin, DEVICE, arrays)
        self._next_state += 1
        self.states[state.state_id] = state
        self.device_lru[state.state_id] = state
        self.device_lru_bytes += size
        self.device_retained += size
        self._index[key] = state
        if self._length_counts.get(len(key), 0) == 0:
            insort(self._lengths, len(key))
        self._length_counts[len(key)] = self._length_counts.get(len(key), 0) + 1
        return state

    # -- movement --------------------------------------------------------

    def begin_offload(self, state: RetainedState) -> None:
        del self.device_lru[state.state_id]
        self.device_lru_bytes -= state.size
        self.offloading_bytes += state.size
        self.host_retained += state.size
        state.tier = OFFLOADING

    def end_offload(self, state: RetainedState) -> None:
        """The host copy is complete: the device arrays are released."""
        self.offloading_bytes -= state.size
        self.device_retained -= state.size
        state.device = None
        if state.taken:
            state.tier = RELOADING
        else:
            state.tier = HOST
            self.host_lru[state.state_id] = state
            self.host_lru_bytes += state.size

    def end_reload(self, state: RetainedState) -> tuple[jax.Array, jax.Array]:
        """The device copy is complete: the host arrays are released and the state leaves the pool."""
        self.host_retained -= state.size
        state.host = None
        del self.states[state.state_id]
        assert state.device is not None, "the reload put the host arrays on the device before it ended"
        return state.device

    def drop_from_device(self, state: RetainedState) -> None:
        del self.device_lru[state.state_id]
        self.device_lru_bytes -= state.size
        self.device_retained -= state.size
        self._forget(state)

    def drop_from_host(self, state: RetainedState) -> None:
        del self.host_lru[state.state_id]
        self.host_lru_bytes -= state.size
        self.host_retained -= state.size
        self._forget(state)

    def _forget(self, state: RetainedState) -> None:
        self._unindex(state)
        del self.states[state.state_id]
        state.device = state.host = None

    def _unindex(self, state: RetainedState) -> None:
        del self._index[state.key]
        count = self._length_counts[len(state.key)] - 1
        self._length_counts[len(state.key)] = count
        if count == 0:
            del self._lengths[bisect_left(self._lengths, len(state.key))]


def check_budget(pool: StateManager, active: Iterable[tuple[str, int, int]]) -> tuple[int, int]:
    """Check the pool's invariants against the arrays it holds; returns the measured (device, host) bytes.

    active: (request_id, reservation, KV bytes the request holds: its reused arrays' nbytes or its row's
    positions * kv_bytes_per_position) per admitted request. Raises AssertionError naming the broken invariant.
    """
    device, host = pool.measured()
    if device != pool.device_retained:
        raise AssertionError(f"device arrays hold {device} bytes, the pool accounts {pool.device_retained}")
    if host > pool.host_retained:
        raise AssertionError(f"host arrays hold {host} bytes, the pool accounts {pool.host_retained}")
    reserved = 0
    for request_id, reservation, held in active:
        if held > reservation:
            raise AssertionError(f"request {request_id!r} holds {held} bytes of KV, over its reservation {reservation}")
        reserved += reservation
    if reserved != pool.reserved:
        raise AssertionError(f"active reservations sum to {reserved}, the pool accounts {pool.reserved}")
    if device + reserved > pool.config.device_kv_bytes:
        raise AssertionError(
            f"device {device} + reserved {reserved} bytes > device_kv_bytes {pool.config.device_kv_bytes}"
        )
    if pool.host_retained > pool.config.host_kv_bytes:
        raise AssertionError(f"host {pool.host_retained} bytes > host_kv_bytes {pool.config.host_kv_bytes}")
    return device + reserved, host
