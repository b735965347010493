"""Stack profiles: what a serving engine adds around the GPU kernels.

The GPU profile prices kernels on a card; a stack profile prices the engine around them:
the host's work per step and how much of it the GPU hides (async scheduling), CUDA-graph
replay (decode batches padded to the captured sizes, kernel launch gaps shrunk), the
tensor-parallel all-reduce, and the per-request costs outside the engine loop (HTTP,
tokenization, detokenization, streaming) that a client sees in TTFT and E2E.

``eager`` is slotune's own engine as the GPU profile measured it: host costs from the
profile's ``system`` section, no overlap, no graphs, no per-request costs. Every other
stack is a small JSON file (shipped under ``stacks/`` or given by path) whose fields are
fitted from measured serving runs by ``slotune calibrate --from-runs``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from slotune.engine.sim.hardware import UnknownNameError
from slotune.engine.sim.profile import SystemProfile

STACK_DIR = Path(__file__).parent / "stacks"
ALLREDUCE_KINDS = ("ring", "custom")
DEFAULT_STACK = "vllm-v1"
EAGER = "eager"


@dataclass(frozen=True)
class StackProfile:
    """``host_step_us`` + ``host_per_request_us`` × scheduled requests + ``host_per_token_us``
    × scheduled tokens is the host's hideable work per step (scheduling, output processing,
    detokenization); ``host_overlap`` of the shorter of it and the GPU's work hides behind
    the longer (a step costs ``gpu + host − host_overlap × min(gpu, host)``: 1 is async
    scheduling, ``max(gpu, host)``; 0 a synchronous engine, their sum). ``host_exposed_us``
    is host work on the GPU's critical path that no overlap hides (building and copying the
    step's inputs, launching the graph, the sampler's sync): every step pays it on top.
    With ``cuda_graphs`` a step of at most ``graph_max_tokens`` tokens (``0``: twice
    ``max_num_seqs``, capped at 512, as vLLM; either way no more than the step's token
    budget, as vLLM caps ``max_cudagraph_capture_size`` by ``max_num_batched_tokens``) runs
    as a graph: its token count is padded to the next captured size and every kernel's fixed
    overhead is scaled by ``graph_overhead_scale``. ``request_in_us`` is a request's cost
    before the engine sees it, ``request_out_us`` after a token leaves the engine until the
    client has it. ``gpu_time_scale`` multiplies every kernel's time: how the engine's own
    kernels (paged-attention and fused elementwise kernels, GEMMs replayed in graphs) run
    against the isolated kernels the GPU profile measured. With ``schedule_ahead`` the
    scheduler plans a step while the one before it runs (vLLM V1's async scheduling): a
    request that arrives, or a seat that frees, while the engine is busy reaches the GPU a
    step later than a synchronous loop would run it. ``decode_seq_layer_us`` is the
    engine's work per decoding request and layer beside attention's KV read (KV-cache
    write, slot and position metadata), seen in served runs but not in isolated attention
    kernels. ``allreduce`` is how tensor-parallel GPUs sum their partial results
    (``cost_model.allreduce_seconds``): ``ring``, NCCL's ring, or ``custom``, the engine's
    own peer-to-peer all-reduce on a GPU fabric (one or two stages whatever the GPU
    count, NCCL above its buffer); ``allreduce_latency_us`` is a ring hop's or a stage's
    latency. ``None`` host or all-reduce fields take the GPU profile's values."""

    name: str = EAGER
    host_step_us: float | None = None
    host_per_request_us: float | None = None
    host_per_token_us: float = 0.0
    host_exposed_us: float = 0.0
    host_overlap: float = 0.0
    cuda_graphs: bool = False
    graph_max_tokens: int = 0
    graph_overhead_scale: float = 1.0
    gpu_time_scale: float = 1.0
    request_in_us: float = 0.0
    request_out_us: float = 0.0
    schedule_ahead: bool = False
    decode_seq_layer_us: float = 0.0
    allreduce_latency_us: float | None = None
    allreduce_eff: float | None = None
    allreduce: str = "ring"
    note: str = ""
    engine: str = ""
    provenance: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("host_step_us", "host_per_request_us", "allreduce_latency_us"):
            v = getattr(self, name)
            if v is not None and not v >= 0:
                raise ValueError(f"stack {self.name!r}: {name} must be >= 0 (got {v})")
        if not 0 < self.gpu_time_scale <= 2:
            raise ValueError(
                f"stack {self.name!r}: gpu_time_scale must be in (0, 2] (got {self.gpu_time_scale})"
            )
        for name in (
            "request_in_us",
            "request_out_us",
            "graph_overhead_scale",
            "decode_seq_layer_us",
            "host_per_token_us",
            "host_exposed_us",
        ):
            if not getattr(self, name) >= 0:
                raise ValueError(
                    f"stack {self.name!r}: {name} must be >= 0 (got {getattr(self, name)})"
                )
        if not 0 <= self.host_overlap <= 1:
            raise ValueError(
                f"stack {self.name!r}: host_overlap must be in [0, 1] (got {self.host_overlap})"
            )
        if self.allreduce_eff is not None and not 0 < self.allreduce_eff <= 1:
            raise ValueError(
                f"stack {self.name!r}: allreduce_eff must be in (0, 1] (got {self.allreduce_eff})"
            )
        if self.graph_max_tokens < 0:
            raise ValueError(f"stack {self.name!r}: graph_max_tokens must be >= 0")
        if self.allreduce not in ALLREDUCE_KINDS:
            raise ValueError(
                f"stack {self.name!r}: allreduce must be one of {', '.join(ALLREDUCE_KINDS)} "
                f"(got {self.allreduce!r})"
            )

    @property
    def request_latency_s(self) -> float:
        """Seconds a request's every client-side time lags the engine's: in plus out."""
        return (self.request_in_us + self.request_out_us) * 1e-6

    def on(self, system: SystemProfile) -> StackProfile:
        """This stack with every field it leaves unset (``None``) taken from a GPU
        profile's ``system`` section."""
        return replace(
            self,
            host_step_us=_given(self.host_step_us, system.cpu_step_us),
            host_per_request_us=_given(self.host_per_request_us, system.cpu_per_request_us),
            allreduce_latency_us=_given(self.allreduce_latency_us, system.allreduce_latency_us),
            allreduce_eff=_given(self.allreduce_eff, system.allreduce_eff),
        )

    def with_values(self, **values: Any) -> StackProfile:
        return replace(self, **values)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "source"}


PARAMETER_RANGES: dict[str, tuple[float, float, str]] = {
    "host_step_us": (
        200.0,
        4000.0,
        "hideable host work per step (scheduler pass, output processing): vLLM V1 on a "
        "server CPU, 0.3-2 ms",
    ),
    "host_per_request_us": (0.0, 40.0, "hideable host work per scheduled request"),
    "host_per_token_us": (0.0, 2.0, "hideable host work per scheduled token"),
    "host_exposed_us": (
        100.0,
        3000.0,
        "host work per step the GPU waits for even with async scheduling (input tensors "
        "built and copied, graph launch, sampler sync): 0.2-2.5 ms",
    ),
    "request_in_us": (
        500.0,
        15000.0,
        "per request outside the engine loop (HTTP, tokenization, first chunk streamed)",
    ),
    "allreduce_latency_us": (
        1.0,
        30.0,
        "per ring hop (NCCL) or per stage (custom all-reduce over NVLink: 2-10 us) of one "
        "all-reduce",
    ),
    "gpu_time_scale": (
        0.9,
        1.25,
        "the engine's kernels against the isolated kernels the GPU profile measured",
    ),
    "decode_seq_layer_us": (
        0.0,
        1.0,
        "engine work per decoding request and layer beside attention (KV write, metadata)",
    ),
    "graph_overhead_scale": (
        0.02,
        0.5,
        "a kernel's fixed overhead replayed in a CUDA graph against launched eagerly",
    ),
}
"""Each fitted stack constant: (low, high, what it is physically). ``calibration.from_runs``
fits within these bounds; a fitted value on a bound is reported, not trusted."""


def _given(value: float | None, default: float) -> float:
    return default if value is None else value


def graph_max_tokens(stack: StackProfile, max_num_seqs: int, max_num_batched_tokens: int) -> int:
    """The largest captured CUDA-graph size: the stack's (or ``min(2 max_num_seqs, 512)``),
    never above the step's token budget (vLLM's ``max_cudagraph_capture_size``); 0 without
    graphs."""
    if not stack.cuda_graphs:
        return 0
    cap = stack.graph_max_tokens or default_graph_max_tokens(max_num_seqs)
    return max(1, min(cap, max_num_batched_tokens)) if max_num_batched_tokens > 0 else cap


def graph_capture_sizes(max_tokens: int) -> tuple[int, ...]:
    """vLLM's default CUDA-graph batch sizes up to ``max_tokens``: 1, 2, 4, then every 8
    up to 256 and every 16 above."""
    sizes = [s for s in (1, 2, 4) if s <= max_tokens]
    sizes += range(8, min(max_tokens, 255) + 1, 8)
    sizes += range(256, max_tokens + 1, 16)
    if max_tokens > 0 and (not sizes or sizes[-1] != max_tokens):
        sizes.append(max_tokens)
    return tuple(sizes)


def default_graph_max_tokens(max_num_seqs: int) -> int:
    return min(2 * max_num_seqs, 512)


def stack_from_dict(data: dict[str, Any], where: str) -> StackProfile:
    known = {f.name for f in fields(StackProfile)}
    unknown = sorted(set(data) - known - {"fitted_on", "fit", "alias_of", "derived"})
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}; known: {sorted(known)}")
    values = {k: v for k, v in data.items() if k in known}
    values.setdefault("name", Path(where).stem)
    values["source"] = where
    try:
        return StackProfile(**values)
    except TypeError as e:
        raise ValueError(f"{where}: {e}") from None


def shipped_stacks() -> list[str]:
    return [EAGER, *sorted(p.stem for p in STACK_DIR.glob("*.json"))]


def load_stack(name_or_path: str | None = None) -> StackProfile:
    """A shipped stack by name (``None``: the default), ``eager``, or a stack JSON file.

    (A GPU profile that ``slotune calibrate`` measured through slotune's own engine names
    ``eager`` itself; the simulated executor takes that when no stack is given.)"""
    name = DEFAULT_STACK if name_or_path is None else name_or_path
    if name == EAGER:
        return StackProfile()
    path = Path(name)
    if not (name.endswith(".json") or path.is_file()):
        path = STACK_DIR / f"{name}.json"
        if not path.is_file():
            raise UnknownNameError(
                f"unknown stack {name!r}; known stacks: {', '.join(shipped_stacks())} "
                "(or give the path of a stack JSON file)"
            )
    if not path.is_file():
        raise UnknownNameError(f"stack file {name!r} does not exist")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read a stack profile ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a stack profile is a JSON object")
    target = data.get("alias_of")
    if isinstance(target, str) and path.parent == STACK_DIR:
        # an old name of a shipped profile: its values, under the name asked for
        return replace(load_stack(target), name=str(data.get("name", path.stem)))
    return stack_from_dict(data, str(path))
