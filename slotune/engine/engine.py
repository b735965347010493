"""The engine: scheduler + KV-cache manager + an executor, with vLLM's familiar surface.

SKELETON (to be completed by the engine-core work): the public signatures below are the
contract the other packages build on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slotune.engine.config import EngineConfig
from slotune.engine.executor import Executor
from slotune.engine.outputs import RequestOutput, StepStats
from slotune.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    pass


class Engine:
    def __init__(
        self, config: EngineConfig, executor: Executor, *, eos_token_id: int | None = None
    ) -> None:
        self.config = config
        self.executor = executor
        self.eos_token_id = eos_token_id
        self.last_step: StepStats | None = None

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams | None = None,
        arrival_time: float = 0.0,
    ) -> None:
        raise NotImplementedError

    def abort_request(self, request_id: str) -> None:
        raise NotImplementedError

    def step(self) -> list[RequestOutput]:
        raise NotImplementedError

    def has_unfinished_requests(self) -> bool:
        raise NotImplementedError

    def stats(self) -> dict[str, Any]:
        raise NotImplementedError
