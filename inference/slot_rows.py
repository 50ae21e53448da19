"""SlotRows: the active requests' rows of the InferenceEngine's slot state, and the works run on them.

A request takes the next free row when its prefill runs (the prefill starts from
the prefix it reuses, assembled on the host into a batch-of-one state) and keeps
it to its end; a decode step runs the rows of its batch (every active row's
bucket when batching, one row when serialized); at its end the row's computed
positions are copied out at their exact length for retention, and the last
active row moves into the freed one, so the active rows stay `[0, len)`. The
programs are SlotExecution's, all compiled before the run; nothing here
compiles per length (retained states move through host numpy slicing and
padding).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import jax
import numpy as np

from inference.execution import ModelExecution, bucket
from inference.policy import InferenceRequest
from inference.slot_execution import EnginePlan, SlotExecution, batch_bucket
from inference.state_manager import DeviceArrays, to_device
from jgpt.model.kv_state import KVState

# A work as recorded, less its requests, bytes moved and times: kind, executed rows, window, processed and
# reused positions, matmul flops, logical memory bytes.
Work = tuple[str, int, int, int, int, int, int]


class RowRequest(Protocol):
    spec: InferenceRequest
    reused: int  # positions of the retained prefix it continues
    held: DeviceArrays | None  # that prefix's (keys, values) until the prefill consumes them
    step: int  # ids selected so far
    output_ids: list[int]
    row: int | None  # its slot row, from its prefill to its end


class SlotRows:
    def __init__(self, execution: ModelExecution, plan: EnginePlan):
        self.execution = execution
        self.plan = plan
        self.programs = SlotExecution(execution, plan)
        self.slots = self.programs.empty_slots()
        self.empty_start = self.programs.empty_start()
        self.rows: list[RowRequest] = []  # slot row -> its request; active rows are [0, len)

    def compile(self) -> tuple[int, int]:
        """Run every program once before the clock starts: (programs, wall microseconds)."""
        self.slots, compiled, wall_us = self.programs.compile(self.slots)
        return compiled, wall_us

    def prefill(self, request: RowRequest) -> tuple[list[int], Work]:
        e, prompt, reused = self.execution, request.spec.prompt_ids, request.reused
        start = self.empty_start if request.held is None else self.start_state(request, request.held)
        count = len(prompt) - reused
        window = np.zeros((1, bucket(count, e.architecture.context)), np.int32)
        window[0, :count] = prompt[reused:]
        request.row = len(self.rows)
        self.rows.append(request)
        rule = self.programs.rule([request.spec])
        chosen, self.slots = self.programs.prefill_into(self.slots, start, window, count, request.row, rule)
        request.held = None
        costs = e.costs
        work = ("prefill", 1, window.shape[1], count, reused, costs.matmul_flops(reused, len(prompt)),
                costs.memory_bytes(reused, len(prompt)))  # fmt: skip
        return [int(np.asarray(chosen)[0])], work

    def start_state(self, request: RowRequest, held: DeviceArrays) -> KVState:
        """The reused prefix in a batch-of-one state of C slots, assembled on the host (no per-length compile)."""
        n, template = request.reused, self.empty_start
        keys, values = (np.zeros(template.keys.shape, template.keys.dtype) for _ in range(2))
        keys[:, 0, :, :n], values[:, 0, :, :n] = (np.asarray(x) for x in held)
        token_ids = np.zeros((1, self.plan.slot_capacity), np.int32)
        token_ids[0, :n] = request.spec.prompt_ids[:n]
        lengths = np.asarray([n], np.int32)
        return template.replace(**jax.device_put(dict(keys=keys, values=values, token_ids=token_ids, lengths=lengths)))

    def decode(self, batch: Sequence[RowRequest]) -> tuple[list[int], Work]:
        costs = self.execution.costs
        positions = [len(r.spec.prompt_ids) + r.step - 1 for r in batch]
        if self.plan.batching:
            rows = batch_bucket(len(self.rows))
            ids, counts, steps = np.zeros(rows, np.int32), np.zeros(rows, np.int32), np.zeros(rows, np.int32)
            specs: list[InferenceRequest | None] = [None] * rows
            for request in batch:
                assert request.row is not None, "a request decodes in the row its prefill gave it"
                ids[request.row], counts[request.row], steps[request.row] = request.output_ids[-1], 1, request.step
                specs[request.row] = request.spec
            rule = self.programs.rule(specs)
            chosen, self.slots = self.programs.decode_rows(
                self.slots, ids, counts, rule, None if rule is None else steps
            )
            chosen = np.asarray(chosen)  # the one host read of the step
            selected = [int(chosen[r.row]) for r in batch]
        else:
            (request,) = batch
            rows = 1
            assert request.row is not None, "a request decodes in the row its prefill gave it"
            rule = self.programs.rule([request.spec])
            chosen, self.slots = self.programs.decode_row(
                self.slots, request.row, request.output_ids[-1], rule, request.step
            )
            selected = [int(np.asarray(chosen)[0])]
        # A batch reads the fixed bytes of a work (the weights) once, not once per request.
        memory = sum(costs.memory_bytes(p, p + 1) for p in positions) - costs.fixed_memory_bytes * (len(batch) - 1)
        flops = sum(costs.matmul_flops(p, p + 1) for p in positions)
        return selected, ("decode", rows, 1, len(batch), sum(positions), flops, memory)

    def row_arrays(self, row: int, positions: int) -> DeviceArrays:
        """A row's first `positions` slots as exact-length device arrays [layers, kv_heads, positions, head_dim]."""
        one = self.programs.extract_row(self.slots, row)
        keys, values = (np.asarray(x)[:, 0, :, :positions] for x in (one.keys, one.values))
        return to_device((keys, values))

    def release(self, request: RowRequest) -> None:
        """Keep the active rows compacted: the last active row moves into the freed one."""
        last = self.rows.pop()
        if last is not request:
            assert last.row is not None and request.row is not None, "both are active rows"
            self.slots = self.programs.move_row(self.slots, last.row, request.row)
            last.row = request.row
            self.rows[request.row] = last
        request.row = None
