"""Deployments: several engines on one virtual clock behind a router, co-located replicas
or prefill/decode disaggregation (``spec``, ``router``, ``run``)."""

from slotune.cluster.run import ClusterResult, run_cluster
from slotune.cluster.spec import LINKS, ClusterSpec, InstanceSpec, Link, RouterSpec, get_link

__all__ = [
    "LINKS",
    "ClusterResult",
    "ClusterSpec",
    "InstanceSpec",
    "Link",
    "RouterSpec",
    "get_link",
    "run_cluster",
]
