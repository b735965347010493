"""The real engine read against its device: each step's FLOPs and bytes (the cost model's
per-op formulas on the checkpoint's config) against a count from the loaded tensors, MBU
and MFU against the ceilings measured on this CPU, and the report's hardware charts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from slotune.cli.app import app
from slotune.engine import Engine, EngineConfig
from slotune.engine.model.peaks import device_ceilings, measured_ceilings
from slotune.reports.hardware import analyse
from slotune.reports.runs import load_run
from slotune.workloads import Trace, TraceRequest, run_engine, summarize

PROMPT, OUTPUT = 40, 4


@pytest.fixture(scope="module")
def engine_run(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One request (a 40-token prefill, then three decodes) on the tiny checkpoint, stored
    as ``bench --out`` stores it."""
    engine = Engine.local(
        EngineConfig(max_num_batched_tokens=64, max_model_len=256),
        model=str(tiny_dir),
        device="cpu",
    )
    request = TraceRequest(request_id="a", prompt_len=PROMPT, output_len=OUTPUT)
    trace = Trace(name="one", requests=(request,))
    result = run_engine(engine, trace)
    out = tmp_path_factory.mktemp("engine_run")
    _, summary = _stored(engine, result, out)
    return {"engine": engine, "result": result, "summary": summary, "dir": out}


def _stored(engine: Engine, result: Any, out: Path) -> tuple[Any, dict[str, Any]]:
    """``result`` written to ``out`` as ``bench --out`` writes it, read back, and its
    summary."""
    result.save(out)
    summary = summarize(result) | {"backend": "engine", "config": engine.config.to_dict()}
    (out / "summary.json").write_text(json.dumps(summary))
    return load_run(out, "run"), summary


def _by_hand(executor: Any, m: int, context: int) -> tuple[int, int]:
    """(FLOPs, bytes) of a step of ``m`` tokens, one sampled, attending to ``context`` KV
    tokens, counted from the loaded modules: every linear layer's weights read once (the
    LM head for the sampled row only) with its input and output rows, the RMSNorm, residual,
    RoPE and SwiGLU passes of the config's widths, and the cached K and V read."""
    model, kv, c = executor.model, executor._kv[0], executor.model_config
    size = next(model.parameters()).element_size()
    h, layers, hd = c.hidden_size, c.num_hidden_layers, c.head_dim
    weights = acts = flops = 0
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear):
            rows = 1 if name == "lm_head" else m
            weights += mod.weight.numel() * size
            acts += rows * (mod.in_features + mod.out_features) * size
            flops += 2 * rows * mod.weight.numel()
    per_layer = 2 * 2 * h + 2 * 3 * h  # two norms (read, write), two residual adds (2 in, 1 out)
    per_layer += 2 * (c.num_attention_heads + c.num_key_value_heads) * hd  # RoPE on q and k
    per_layer += 3 * c.intermediate_size  # SwiGLU: gate and up in, one out
    passes = m * (layers * per_layer + 2 * h + 2 * h) * size  # + embedding, final norm
    kv_token = 2 * kv[:, 0, 0].numel() * kv.element_size()  # K and V, every layer
    flops += 4 * c.num_attention_heads * hd * layers * context
    return flops, weights + acts + passes + kv_token * context


def test_a_real_step_moves_and_computes_what_its_tensors_say(engine_run: dict[str, Any]) -> None:
    engine, result = engine_run["engine"], engine_run["result"]
    hw = analyse(load_run(engine_run["dir"], "run"), engine_run["summary"])
    steps = result.steps
    assert list(steps["num_decode_tokens"]) == [0, 1, 1, 1]
    executor = engine.executor
    model = executor.model
    assert next(model.parameters()).dtype == torch.float32  # 4-byte values on the CPU
    for i in (1, 2, 3):  # decodes of the prompt plus the tokens so far
        context = int(steps["decode_context_sum"][i])
        assert context == PROMPT + i
        flops, nbytes = _by_hand(executor, 1, context)
        assert hw.steps["flops"][i] == pytest.approx(flops, rel=1e-12)
        assert hw.steps["hbm_bytes"][i] == pytest.approx(nbytes, rel=1e-12)
        seconds = steps["duration_s"][i]
        assert hw.steps["achieved_flops"][i] == pytest.approx(flops / seconds, rel=1e-9)
        assert hw.steps["mbu"][i] == pytest.approx(nbytes / seconds / hw.peak[0], rel=1e-9)
    # the tiny model's weights: 2 layers of qkv, o, gate-up and down, embedding, LM head
    c = executor.model_config
    per_layer = 64 * (64 + 2 * 32) + 64 * 64 + 64 * 2 * 128 + 128 * 64
    assert not c.tie_word_embeddings and (c.hidden_size, c.vocab_size) == (64, 512)
    assert sum(p.numel() for p in model.parameters()) == 2 * per_layer + 2 * 512 * 64 + 5 * 64


def test_mbu_and_mfu_against_the_ceilings_measured_here(engine_run: dict[str, Any]) -> None:
    recorded = engine_run["summary"]["hardware"]
    assert recorded["device"] == "cpu" and recorded["dtype_bytes"] == 4
    assert recorded["ceilings"]["source"].startswith("measured on this CPU")
    assert recorded["model_config"]["hidden_size"] == 64
    hw = analyse(load_run(engine_run["dir"], "run"), engine_run["summary"])
    assert hw.measured and hw.fitted is None and hw.peak_name == "measured"
    assert hw.peak == (
        recorded["ceilings"]["hbm_bytes_per_s"],
        recorded["ceilings"]["flops_per_s"],
    )
    assert 0 < hw.mbu() <= 1.5 and 0 < hw.mfu() <= 1.5
    assert (hw.steps["mbu"] > 0).all() and hw.steps["mbu"].max() <= 1.5
    assert (hw.steps["mfu"] > 0).all() and hw.steps["mfu"].max() <= 1.5
    # the op floors and the rest add up to the measured step time
    assert sum(hw.ops.values()) == pytest.approx(hw.seconds, rel=1e-9)
    assert hw.kv_capacity_gib == pytest.approx(recorded["kv_capacity_bytes"] / 2**30)


def test_ceilings_are_measured_once_per_process() -> None:
    cpu = torch.device("cpu")
    first = device_ceilings(cpu, torch.float32)
    hits = measured_ceilings.cache_info().hits
    again = device_ceilings(cpu, torch.float32)
    assert measured_ceilings.cache_info().hits == hits + 1
    assert again == first and first["hbm_bytes_per_s"] > 0 and first["flops_per_s"] > 0


def test_a_real_engine_bench_report_draws_its_hardware_charts(
    tiny_dir: Path, tmp_path: Path
) -> None:
    trace = tmp_path / "short.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"id": f"r{i}", "prompt_len": 30 + 10 * i, "output_len": 8}) + "\n"
            for i in range(4)
        )
    )
    out = tmp_path / "bench"
    args = ["bench", "--backend", "engine", "--model", str(tiny_dir), "--trace", str(trace)]
    res = CliRunner().invoke(app, [*args, "--rate", "50", "--out", str(out)])
    assert res.exit_code == 0, res.output
    html = (out / "report.html").read_text()
    section = html[html.index('id="hardware"') :]
    for key in ("roofline", "utilization", "kv_memory"):
        assert f'data-figure="{key}"' in section, key
    assert "data-empty" not in section and "Not read" not in section
    assert "not simulated" not in html
    assert "measured on this CPU" in section and "measured roof" in section


def test_a_known_gpu_is_read_against_its_datasheet(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA the catalogue's figures for the card's name, nothing measured; a float32
    model there (no datasheet rate) or an unknown card would be measured instead."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    hits = measured_ceilings.cache_info()
    got = device_ceilings(torch.device("cuda"), torch.bfloat16)
    assert (got["hbm_bytes_per_s"], got["flops_per_s"]) == (3350e9, 989.4e12)
    assert got["source"].startswith("from the datasheet of the NVIDIA H100 SXM5 80GB")
    assert measured_ceilings.cache_info() == hits


def test_a_moe_decode_runs_the_flops_of_its_routed_experts(
    mixtral_dir: Path, tmp_path: Path
) -> None:
    """Mixtral (4 experts, top-2): a one-token decode runs every dense linear layer, the
    router and two experts of each layer, counted from the loaded tensors."""
    engine = Engine.local(
        EngineConfig(max_num_batched_tokens=64, max_model_len=256),
        model=str(mixtral_dir),
        device="cpu",
    )
    request = TraceRequest(request_id="a", prompt_len=PROMPT, output_len=2)
    result = run_engine(engine, Trace(name="one", requests=(request,)))
    hw = analyse(*_stored(engine, result, tmp_path))
    executor = engine.executor
    c = executor.model_config
    linear = sum(
        mod.weight.numel() for mod in executor.model.modules() if isinstance(mod, torch.nn.Linear)
    )
    moe_layers = [layer.mlp for layer in executor.model.layers]
    top_k = moe_layers[0].top_k
    experts = sum(
        top_k * (moe.experts_gate_up[0].numel() + moe.experts_down[0].numel()) for moe in moe_layers
    )
    context = int(result.steps["decode_context_sum"][1])
    attention = 4 * c.num_attention_heads * c.head_dim * c.num_hidden_layers * context
    assert (top_k, context) == (2, PROMPT + 1)
    assert hw.steps["flops"][1] == pytest.approx(2 * (linear + experts) + attention, rel=1e-12)
