"""InspectionState: what the report shows, selected over recorded values only.

A state names one inspected request computation (`run_id`), one position in its
accepted token sequence, one captured observation (or none), the surface in
focus, one step of the architecture walkthrough and one recorded computation.
Selecting validates against the recorded data and returns a new state; nothing
here (or in the page's script, which mirrors `select`) ever runs inference.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from jgpt.foundation.errors import ApiError

SURFACES = ("request", "model", "architecture", "resources")


@dataclasses.dataclass(frozen=True)
class InspectionState:
    run_id: str
    position: int
    observation_id: str | None
    surface: str
    architecture_step: int
    computation_index: int | None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Inspectable:
    """The recorded values a state may select among (from one recording of an experiment record)."""

    observations: Mapping[str, Any]  # experiments.lab_recording observations document
    walkthrough: Mapping[str, Any]  # ArchitectureWalkthrough
    computations: Mapping[str, list]  # request_id -> recorded CacheComputations

    def request(self, run_id: str) -> Mapping[str, Any]:
        for request in self.observations["requests"]:
            if run_id == f"{self.observations['run_id']}/{request['request_id']}":
                return request
        raise ApiError("run_id", f"{run_id!r} is not an inspected computation of this record")

    def initial(self) -> InspectionState:
        """The first inspected request, at the position whose prediction is its first output token."""
        first = self.observations["requests"][0]
        return self.check(
            InspectionState(
                run_id=f"{self.observations['run_id']}/{first['request_id']}",
                position=first["prompt_length"] - 1,
                observation_id=first["attention"][0]["id"],
                surface="model",
                architecture_step=0,
                computation_index=0,
            )
        )

    def select(self, state: InspectionState, **changes: Any) -> InspectionState:
        """`state` with `changes` applied; changing the request resets position and observation."""
        if "run_id" in changes and changes["run_id"] != state.run_id:
            request = self.request(changes["run_id"])
            changes.setdefault("position", request["prompt_length"] - 1)
            changes.setdefault("observation_id", request["attention"][0]["id"])
            changes.setdefault("computation_index", 0)
        unknown = set(changes) - {f.name for f in dataclasses.fields(InspectionState)}
        if unknown:
            raise ApiError(min(unknown), "is not an InspectionState field")
        return self.check(dataclasses.replace(state, **changes))

    def check(self, state: InspectionState) -> InspectionState:
        request = self.request(state.run_id)
        last = len(request["tokens"]) - 2  # the last position with a recorded prediction
        if not isinstance(state.position, int) or not 0 <= state.position <= last:
            raise ApiError("position", f"must be a position 0..{last} of the accepted sequence, got {state.position!r}")
        if state.surface not in SURFACES:
            raise ApiError("surface", f"must be one of {', '.join(SURFACES)}; got {state.surface!r}")
        if state.observation_id is not None and state.observation_id not in request["observation_ids"]:
            raise ApiError("observation_id", f"{state.observation_id!r} is not an observation of {state.run_id}")
        if state.surface == "model" and state.observation_id is None:
            raise ApiError("observation_id", "the model surface shows an observation; select one")
        stages = len(self.walkthrough["stages"])
        if not isinstance(state.architecture_step, int) or not 0 <= state.architecture_step < stages:
            raise ApiError(
                "architecture_step", f"must be a stage index 0..{stages - 1}, got {state.architecture_step!r}"
            )
        works = len(self.computations.get(request["request_id"], ()))
        if state.computation_index is not None and not 0 <= state.computation_index < works:
            raise ApiError("computation_index", f"must be 0..{works - 1} or null, got {state.computation_index!r}")
        return state

    def shown(self, state: InspectionState) -> dict[str, Any]:
        """What the page shows for a state: the values the report's panels render."""
        request = self.request(state.run_id)
        observation = next((o for o in request["attention"] if o["id"] == state.observation_id), None)
        return {
            "token": request["tokens"][state.position],
            "prediction": request["predictions"][state.position],
            "attention_row": None
            if observation is None
            else [heads for heads in observation["values"][state.position]],
            "stage": self.walkthrough["stages"][state.architecture_step],
            "computation": None
            if state.computation_index is None
            else self.computations[request["request_id"]][state.computation_index],
        }
