"""KVCache: device and host byte budgets and exact whole-prefix LRU retention.

This is the residency bookkeeping of one serving run: the KVResidency policy
(kvsim/kv_residency.py) owns one while kvsim's engine or the InferenceEngine
drives it, and it never escapes the run. It holds no keys and values (a driver
keeps those, if any, by state id). The rules it implements are written out in
docs/kvsim.md:

* a retained state is the KV of an exact token sequence; a lookup finds the
  longest retained sequence that is a proper prefix of the prompt;
* retained states are indexed by their token key, and a lookup tests only the
  prompt prefixes whose lengths some retained state has, longest first;
* device bytes = active reservations + states resident on the device (a state
  being offloaded still occupies the device until its transfer ends); host bytes
  = states on the host, including ones being offloaded to or reloaded from it.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import OrderedDict
from dataclasses import dataclass

from kvsim.system import KVCacheConfig

DEVICE, OFFLOADING, HOST, RELOADING = "device", "offloading", "host", "reloading"


@dataclass(eq=False, slots=True)
class RetainedState:
    state_id: str
    key: bytes  # token_key of the sequence; 4 bytes per position
    positions: int
    size: int  # bytes
    origin: str  # request whose computation produced it
    tier: str
    taken: bool = False  # claimed by a request (reload pending or in flight)


class KVCache:
    def __init__(self, config: KVCacheConfig, kv_bytes_per_position: int):
        self.config = config
        self.kv_bytes_per_position = kv_bytes_per_position
        self.reserved = 0  # bytes of active requests' reservations
        self.device_retained = 0  # retained states occupying the device (incl. those being offloaded)
        self.host_retained = 0
        self.offloading_bytes = 0  # device bytes that free when in-flight offloads end
        self.device_lru: OrderedDict[str, RetainedState] = OrderedDict()  # least recent first
        self.host_lru: OrderedDict[str, RetainedState] = OrderedDict()
        self.device_lru_bytes = 0  # bytes a device eviction can free
        self.host_lru_bytes = 0  # bytes a host drop can free
        self._index: dict[bytes, RetainedState] = {}
        self._lengths: list[int] = []  # distinct key lengths in the index, ascending
        self._length_counts: dict[int, int] = {}
        self._next_state = 0

    # -- occupancy -------------------------------------------------------

    @property
    def device_bytes(self) -> int:
        return self.reserved + self.device_retained

    def device_free(self) -> int:
        return self.config.device_kv_bytes - self.device_bytes

    def host_free(self) -> int:
        return self.config.host_kv_bytes - self.host_retained

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
            self.device_lru_bytes -= state.size
            self.device_retained -= state.size  # the bytes become part of the request's reservation
        elif state.tier == HOST:
            del self.host_lru[state.state_id]
            self.host_lru_bytes -= state.size
            state.tier = RELOADING

    def has(self, key: bytes) -> bool:
        return key in self._index

    def retain(self, key: bytes, origin: str) -> RetainedState:
        """A finished request's sequence becomes the most recently used device state."""
        positions = len(key) // 4
        state = RetainedState(
            f"s{self._next_state}", key, positions, positions * self.kv_bytes_per_position, origin, DEVICE
        )
        self._next_state += 1
        self.device_lru[state.state_id] = state
        self.device_lru_bytes += state.size
        self.device_retained += state.size
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
        self.offloading_bytes -= state.size
        self.device_retained -= state.size
        if state.taken:
            state.tier = RELOADING
        else:
            state.tier = HOST
            self.host_lru[state.state_id] = state
            self.host_lru_bytes += state.size

    def end_reload(self, state: RetainedState) -> None:
        self.host_retained -= state.size

    def drop_from_device(self, state: RetainedState) -> None:
        del self.device_lru[state.state_id]
        self.device_lru_bytes -= state.size
        self.device_retained -= state.size
        self._unindex(state)

    def drop_from_host(self, state: RetainedState) -> None:
        del self.host_lru[state.state_id]
        self.host_lru_bytes -= state.size
        self.host_retained -= state.size
        self._unindex(state)

    def _unindex(self, state: RetainedState) -> None:
        del self._index[state.key]
        count = self._length_counts[len(state.key)] - 1
        self._length_counts[len(state.key)] = count
        if count == 0:
            del self._lengths[bisect_left(self._lengths, len(state.key))]
