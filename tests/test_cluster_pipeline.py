"""Pipeline parallelism priced beside TP: stages, micro-batches and their bubble."""

from __future__ import annotations

import math
import shlex
from dataclasses import replace

import pandas as pd
import pytest

from slotune.cluster import ClusterSpec, InstanceSpec, run_cluster
from slotune.cluster.export import launch_lines, manifests
from slotune.engine.config import EngineConfig
from slotune.engine.engine import Engine
from slotune.engine.sim.capacity import determine_capacity
from slotune.engine.sim.cost_model import CostModel
from slotune.engine.sim.executor import SimExecutor
from slotune.engine.sim.models import get_model
from slotune.engine.sim.pipeline import PipelineSimExecutor, pipeline_seconds, stage_model
from slotune.engine.sim.profile import load_profile
from slotune.workloads import load_trace
from slotune.workloads.arrivals import ArrivalSpec


def test_the_bubble_shrinks_with_micro_batches() -> None:
    assert pipeline_seconds(1.0, 4, 1, 0.0) == pytest.approx(4.0)  # one batch: no overlap
    assert pipeline_seconds(1.0, 4, 4, 0.0) == pytest.approx(7 / 4)
    assert pipeline_seconds(1.0, 4, 1000, 0.0) == pytest.approx(1.0, rel=0.01)
    assert pipeline_seconds(1.0, 1, 8, 0.5) == pytest.approx(1.0)  # one stage: no hop
    assert pipeline_seconds(1.0, 3, 3, 0.1) == pytest.approx(5 / 3 + 0.2)


@pytest.mark.parametrize("micro_batches", [None, 1, 8])
def test_a_step_is_a_stage_step_through_the_pipeline(micro_batches) -> None:
    ex = PipelineSimExecutor("h100", "llama-3-70b", 2, pp=4, micro_batches=micro_batches)
    profile = load_profile("h100")
    full = get_model("llama-3-70b")
    stage_spec = replace(full, num_layers=math.ceil(full.num_layers / 4))
    stage = CostModel(profile, stage_spec, 2, stack=ex.stack)
    m = micro_batches or 4
    hop_bw = profile.gpu.interconnect_gbps * 1e9 / 2
    for args in [(1024, 1, 1, 0, 0, [(1024, 0)]), (96, 96, 96, 96, 96 * 500, [])]:
        mb = min(m, args[2])
        hop = (
            profile.system.allreduce_latency_us * 1e-6
            + args[0] / mb * full.hidden_size * 2 / hop_bw
        )
        want = stage.step_seconds(*args) * (mb + 3) / mb + 3 * hop
        assert ex.cost_model.step_seconds(*args) == pytest.approx(want, rel=1e-12)


def test_stages_hold_a_share_of_the_layers_and_more_kv() -> None:
    cfg = EngineConfig()
    ex = PipelineSimExecutor("h100", "llama-3-70b", 2, pp=2)
    engine = Engine(cfg, ex)
    model = get_model("llama-3-70b")
    assert ex.model.num_layers == model.num_layers // 2
    want = determine_capacity(load_profile("h100"), stage_model(model, 2), 2, cfg)
    assert engine.capacity.num_gpu_blocks == want.num_gpu_blocks
    tp_only = Engine(cfg, SimExecutor("h100", "llama-3-70b", 2))
    assert engine.capacity.num_gpu_blocks > 2 * tp_only.capacity.num_gpu_blocks


def test_moe_models_are_refused() -> None:
    with pytest.raises(ValueError, match="dense models only"):
        PipelineSimExecutor("h100", "mixtral-8x7b", 2, pp=2)


def test_a_pipelined_replica_in_a_cluster() -> None:
    trace = load_trace("sharegpt-like").head(60)
    inst = InstanceSpec(EngineConfig(prefix_caching="none"), model="llama-3-70b", tp=2, pp=2)
    spec = ClusterSpec.replicas(2, inst, "least-outstanding")
    assert spec.num_gpus == 8
    fast = run_cluster(spec, trace, arrivals=ArrivalSpec(rate=4))
    slow = run_cluster(spec, trace, arrivals=ArrivalSpec(rate=4), stretches=False)
    pd.testing.assert_frame_equal(fast.result.requests, slow.result.requests)
    assert fast.result.requests["error"].isna().all()
    words = shlex.split(launch_lines(spec, "vllm")["mixed-tp2-pp2"])
    assert words[words.index("--pipeline-parallel-size") + 1] == "2"
    docs = manifests(spec, "sglang")
    (dep,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] != "router"]
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 4 and "--pp-size" in c["args"]
