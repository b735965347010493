"""The roofline reading of a step: FLOPs and bytes from the cost model's formulas against a
hand calculation from the models' published shapes, and op times that add up to the step."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from slotune.engine.sim.cost_model import CostModel
from slotune.engine.sim.models import get_model
from slotune.engine.sim.profile import load_profile
from slotune.engine.sim.roofline import (
    OPS,
    estimate_roofline,
    step_roofline,
    step_work,
    steps_roofline,
)
from slotune.engine.sim.stack import load_stack

H100_BW, H100_BF16 = 3350e9, 989.4e12  # datasheet, SXM


def _cm(model: str, tp: int = 2, ep: int = 1, stack: str | None = None) -> CostModel:
    return CostModel(load_profile("h100"), get_model(model), tp, stack=load_stack(stack), ep=ep)


def _activations(m: int, *gemms: tuple[int, int]) -> int:
    """bf16 activations in and out of ``[m, k] @ [k, n]`` GEMMs."""
    return sum(2 * m * (k + n) for k, n in gemms)


# Llama-3-8B (config.json): hidden 4096, 32 layers, 32 q / 8 kv heads of 128, FFN 14336,
# vocab 128256, untied embeddings. On two GPUs each holds half of every linear layer.
L8_LAYER_WEIGHTS = 4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336
L8_LM_HEAD = 128256 * 4096


def test_dense_decode_step_reads_its_weights_once_on_two_gpus() -> None:
    cm = _cm("llama-3-8b")
    r = estimate_roofline(cm, 0, 0, num_decodes=1, decode_context=1)
    weights = 2 * (32 * L8_LAYER_WEIGHTS + L8_LM_HEAD) // 2  # bf16, over TP
    acts = 32 * _activations(1, (4096, 3072), (2048, 4096), (4096, 14336), (7168, 4096))
    acts += _activations(1, (4096, 64128))
    assert r.ops["weights"].hbm_bytes == pytest.approx(weights + acts, rel=1e-12)
    # = the model's resident weights per GPU without the embedding table and the norms
    resident = get_model("llama-3-8b").weight_bytes_per_gpu(2)
    embedding, norms = 64128 * 4096 * 2, (32 * 2 + 1) * 4096 * 2
    assert r.ops["weights"].hbm_bytes - acts == resident - embedding - norms
    # one token: two FLOPs per weight it runs through
    assert r.ops["weights"].flops == 2 * weights / 2
    kv = 32 * 2 * 4 * 128 * 2  # layers × K,V × 4 kv heads per GPU × head dim × bf16
    assert r.ops["kv_read"].hbm_bytes == kv
    # by hand: a lone decode moves its weights (the KV of one token and the norms' passes
    # are under 0.1% of that) and runs two FLOPs per weight
    assert r.mbu() == pytest.approx(weights / r.seconds / H100_BW, rel=1e-3)
    assert r.mfu() == pytest.approx(weights / r.seconds / H100_BF16, rel=1e-3)
    assert r.mbu() == pytest.approx(r.hbm_bytes / r.seconds / H100_BW, rel=1e-12)
    assert 0 < r.mbu() < 1 and r.mfu() < 0.01  # a lone decode wastes the tensor cores
    assert r.limit("weights") == "memory"


# Mixtral-8x7B: hidden 4096, 32 layers, 32 q / 8 kv heads of 128, 8 experts of FFN 14336,
# top-2, vocab 32000, untied.
MX_ATTENTION = 4096 * (4096 + 2 * 1024) + 4096 * 4096
MX_EXPERT = 3 * 4096 * 14336
MX_ROUTER = 4096 * 8
MX_LM_HEAD = 32000 * 4096


@pytest.mark.parametrize("batch", [1, 256])
def test_moe_decode_step_reads_the_experts_its_tokens_touch(batch: int) -> None:
    cm = _cm("mixtral-8x7b")
    r = estimate_roofline(cm, 0, 0, num_decodes=batch, decode_context=1)
    touched = 8 * (1 - (1 - 2 / 8) ** batch)  # 2 at one token, all 8 at 256
    assert touched == pytest.approx(2 if batch == 1 else 8)
    weights = (32 * (MX_ATTENTION + touched * MX_EXPERT) + MX_LM_HEAD) * 2 / 2 + 32 * MX_ROUTER * 2
    rows = 2 * batch  # top-2, one expert-parallel rank
    acts = 32 * _activations(batch, (4096, 3072), (2048, 4096), (4096, 8))
    acts += 32 * _activations(rows, (4096, 14336), (7168, 4096))
    acts += _activations(batch, (4096, 16000))
    assert r.ops["weights"].hbm_bytes == pytest.approx(weights + acts, rel=1e-9)
    if batch == 256:  # every expert read: the resident weights over TP, less embedding/norms
        resident = get_model("mixtral-8x7b").weight_bytes_per_gpu(2)
        embedding, norms = 16000 * 4096 * 2, (32 * 2 + 1) * 4096 * 2
        assert r.ops["weights"].hbm_bytes - acts == pytest.approx(
            resident - embedding - norms, rel=1e-7
        )
    active = 32 * (MX_ATTENTION + 2 * MX_EXPERT + MX_ROUTER * 2) + MX_LM_HEAD
    assert r.ops["weights"].flops == pytest.approx(batch * 2 * active / 2, rel=1e-12)
    # by hand: two FLOPs per active weight and token; at one token the step moves the
    # weights it reads (KV, activations and elementwise passes are under 1% of that)
    if batch == 1:
        assert r.mbu() == pytest.approx(weights / r.seconds / H100_BW, rel=1e-2)
    assert r.mfu() == pytest.approx(batch * active / r.seconds / H100_BF16, rel=1e-3)


@pytest.mark.parametrize(
    ("model", "tp", "ep", "stack"),
    [
        ("llama-3-8b", 1, 1, None),
        ("llama-3-8b", 2, 1, "eager"),
        ("mixtral-8x7b", 2, 1, None),
        ("mixtral-8x7b", 4, 2, "eager"),
    ],
)
@pytest.mark.parametrize(
    "shape",
    [
        (1, 1, 1, 1, 900, []),
        (64, 64, 64, 64, 64_000, []),
        (576, 65, 65, 64, 64_000, [(512, 1024)]),
        (4096, 3, 3, 0, 0, [(2048, 0), (1024, 300), (1024, 5000)]),
    ],
)
def test_op_times_add_up_to_the_step(
    model: str, tp: int, ep: int, stack: str | None, shape: tuple
) -> None:
    cm = _cm(model, tp, ep, stack)
    r = step_roofline(cm, *shape)
    assert set(r.ops) == set(OPS)
    assert r.seconds == cm.step_seconds(*shape)
    assert all(o.seconds >= 0 for o in r.ops.values())
    assert sum(o.seconds for o in r.ops.values()) == pytest.approx(r.seconds, rel=1e-9)
    assert (r.ops["allreduce"].link_bytes > 0) == (tp > 1)


def test_bound_ops_follow_the_roofline() -> None:
    cm = _cm("llama-3-8b", tp=1, stack="eager")
    prefill = estimate_roofline(cm, 8192)
    assert prefill.bound_op == "weights" and prefill.limit("weights") == "compute"
    assert prefill.intensity > prefill.datasheet.ridge
    long_decode = estimate_roofline(cm, 0, 0, num_decodes=128, decode_context=16_000)
    assert long_decode.bound_op == "kv_read" and long_decode.limit("kv_read") == "memory"
    assert long_decode.intensity < long_decode.datasheet.ridge
    # the fitted ceilings are below the datasheet: the same step uses more of them
    assert long_decode.mbu(long_decode.fitted) > long_decode.mbu()


def test_step_work_takes_arrays_like_numbers() -> None:
    cm = _cm("mixtral-8x7b", tp=4, ep=2)
    args = [np.array([1.0, 300.0]), np.array([1.0, 2.0]), np.array([10.0, 0.0])]
    arrays = step_work(cm.shard, *args, np.array([0.0, 300 * 150.0]), np.array([0.0, 300.0]))
    for i in range(2):
        one = step_work(cm.shard, *(float(a[i]) for a in args), [0.0, 300 * 150.0][i], [0, 300][i])
        for op, cost in one.items():
            assert arrays[op].flops[i] == pytest.approx(cost.flops, rel=1e-12)
            assert arrays[op].hbm_bytes[i] == pytest.approx(cost.hbm_bytes, rel=1e-12)
            assert arrays[op].link_bytes[i] == pytest.approx(cost.link_bytes, rel=1e-12)


def test_steps_frame_reading_matches_the_single_step_one() -> None:
    cm = _cm("llama-3-8b", tp=1)
    decode = step_roofline(cm, 32, 32, 32, 32, 32 * 700)
    prefill = step_roofline(cm, 512, 1, 1, 0, 0, [(512, 1024)])
    frame = pd.DataFrame(
        {
            "duration_s": [decode.seconds, prefill.seconds],
            "num_scheduled_tokens": [32, 512],
            "num_prefill_tokens": [0, 512],
            "num_decode_tokens": [32, 0],
            "decode_context_sum": [32 * 700, 0],
            "prefill_context_sum": [0, 1536],
        }
    )
    out = steps_roofline(cm.shard, decode.datasheet, frame)
    for i, r in enumerate((decode, prefill)):
        assert out["flops"][i] == pytest.approx(r.flops, rel=1e-12)
        assert out["hbm_bytes"][i] == pytest.approx(r.hbm_bytes, rel=1e-12)
        assert out["mbu"][i] == pytest.approx(r.mbu(), rel=1e-12)
        assert out["mfu"][i] == pytest.approx(r.mfu(), rel=1e-12)
    assert list(out["prefill_share"]) == [0.0, 1.0]
