"""What a deployment is: instances (each an engine on its own GPUs), the link between
prefill and decode instances, and the router in front.

An instance's ``role`` says what it serves: ``mixed`` (a co-located replica: prompts and
decodes), ``prefill`` (runs prompts and hands their KV cache over) or ``decode`` (admits a
request once its KV has arrived). A deployment is either all ``mixed`` replicas or
``prefill`` plus ``decode`` instances (prefill/decode disaggregation).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from slotune.engine.config import EngineConfig

Role = Literal["mixed", "prefill", "decode"]
ROLES: tuple[Role, ...] = ("mixed", "prefill", "decode")
ROUTERS = ("round-robin", "least-outstanding", "least-kv", "prefix-aware")


@dataclass(frozen=True)
class InstanceSpec:
    """One serving instance: an engine with its configuration on ``tp × pp`` GPUs
    (``pp`` pipeline stages, ``micro_batches`` per step: ``engine.sim.pipeline``)."""

    config: EngineConfig = field(default_factory=EngineConfig)
    gpu: str = "h100"
    model: str = "llama-3-8b"
    tp: int = 1
    stack: str | None = None
    quantization: str | None = None
    ep: int = 1
    role: Role = "mixed"
    pp: int = 1
    micro_batches: int | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"InstanceSpec.role: {self.role!r} is not one of {', '.join(ROLES)}")
        if self.tp < 1 or self.pp < 1:
            raise ValueError(f"InstanceSpec: tp and pp must be >= 1 (got {self.tp}, {self.pp})")

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp


@dataclass(frozen=True)
class Link:
    """The path a prompt's KV cache takes from a prefill to a decode instance: one GPU's
    share of it (``bandwidth_bytes_s``, one way) and the latency of a transfer. Each TP
    rank sends its own shard, so a transfer has ``min(tp of both sides)`` of these."""

    name: str
    bandwidth_bytes_s: float
    latency_s: float

    def __post_init__(self) -> None:
        if not (self.bandwidth_bytes_s > 0 and self.latency_s >= 0):
            raise ValueError(
                f"Link {self.name!r}: bandwidth must be > 0 and latency >= 0 "
                f"(got {self.bandwidth_bytes_s}, {self.latency_s})"
            )

    def seconds(self, num_bytes: float, lanes: int = 1) -> float:
        return self.latency_s + num_bytes / (self.bandwidth_bytes_s * lanes)


LINKS = {
    # NVLink 4 (H100 SXM): 900 GB/s both ways per GPU, 450 GB/s one way
    "nvlink": Link("nvlink", 450e9, 10e-6),
    # one 400 Gb/s RDMA NIC per GPU (ConnectX-7, GPUDirect): 50 GB/s
    "rdma": Link("rdma", 50e9, 30e-6),
    # TCP over a 100 Gb/s Ethernet port: 12.5 GB/s, a kernel's round trips of latency
    "tcp": Link("tcp", 12.5e9, 200e-6),
}


def get_link(name: str) -> Link:
    try:
        return LINKS[name]
    except KeyError:
        raise ValueError(f"link {name!r} is unknown; choose one of {', '.join(LINKS)}") from None


@dataclass(frozen=True)
class RouterSpec:
    """How requests pick an instance. ``prefix-aware`` follows the cache-aware policy of
    SGLang's router (and vLLM's, its fork), with their defaults: while the load is
    balanced (busiest minus idlest outstanding requests at most ``balance_abs``, or
    busiest at most ``balance_rel`` × idlest) a request goes to the replica whose earlier
    prompts share the longest prefix with it if that covers at least ``cache_threshold``
    of the prompt, and otherwise (or when unbalanced) to the least loaded (their routers
    take the replica with the smallest prefix tree there). Prefixes are matched in blocks
    of ``block_tokens``."""

    policy: str = "round-robin"
    balance_abs: int = 64
    balance_rel: float = 1.5
    cache_threshold: float = 0.3
    block_tokens: int = 64

    def __post_init__(self) -> None:
        if self.policy not in ROUTERS:
            raise ValueError(
                f"router {self.policy!r} is unknown; choose one of {', '.join(ROUTERS)}"
            )
        if self.block_tokens < 1 or not 0 <= self.cache_threshold <= 1:
            raise ValueError("RouterSpec: block_tokens >= 1 and 0 <= cache_threshold <= 1")


@dataclass(frozen=True)
class ClusterSpec:
    """Instances behind one router; with ``prefill`` and ``decode`` instances the router
    picks a prefill instance by ``router`` and a decode instance by least outstanding
    requests, and the KV cache crosses ``link``."""

    instances: tuple[InstanceSpec, ...]
    router: RouterSpec = field(default_factory=RouterSpec)
    link: Link = field(default_factory=lambda: LINKS["rdma"])

    def __post_init__(self) -> None:
        roles = {i.role for i in self.instances}
        if not self.instances:
            raise ValueError("ClusterSpec: no instance")
        if "mixed" in roles and len(roles) > 1:
            raise ValueError(
                "ClusterSpec: mixed replicas cannot sit beside prefill/decode instances"
            )
        if roles and roles != {"mixed"} and roles != {"prefill", "decode"}:
            raise ValueError("ClusterSpec: a disaggregated deployment needs prefill and decode")

    @property
    def disaggregated(self) -> bool:
        return self.instances[0].role != "mixed"

    @property
    def num_gpus(self) -> int:
        return sum(i.num_gpus for i in self.instances)

    @classmethod
    def replicas(
        cls, n: int, instance: InstanceSpec, router: RouterSpec | str = "round-robin"
    ) -> ClusterSpec:
        """``n`` identical co-located replicas."""
        router = RouterSpec(router) if isinstance(router, str) else router
        return cls((instance,) * n, router)

    @classmethod
    def disaggregate(
        cls,
        prefill: InstanceSpec,
        num_prefill: int,
        decode: InstanceSpec,
        num_decode: int,
        *,
        router: RouterSpec | str = "least-outstanding",
        link: Link | str = "rdma",
    ) -> ClusterSpec:
        """``num_prefill`` prefill and ``num_decode`` decode instances (the P:D ratio)."""
        from dataclasses import replace

        router = RouterSpec(router) if isinstance(router, str) else router
        link = get_link(link) if isinstance(link, str) else link
        p = replace(prefill, role="prefill")
        d = replace(decode, role="decode")
        return cls((p,) * num_prefill + (d,) * num_decode, router, link)
