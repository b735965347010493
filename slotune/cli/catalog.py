"""``slotune gpus``, ``slotune models`` and ``slotune estimate``: the simulator's catalogues."""

from __future__ import annotations

import json
from typing import TypedDict

import typer
from rich.console import Console
from rich.table import Table

from slotune.cli.app import app
from slotune.cli.common import fail


class _ModelRow(TypedDict):
    name: str
    layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    experts: str | None
    params_b: float
    active_params_b: float
    weight_dtype: str
    expert_weight_dtype: str | None
    weights_gb: float
    kv_kib_per_token: float


@app.command()
def gpus(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the GPUs the simulator knows, with their datasheet figures."""
    from slotune.calibration.readers import DERIVED_FROM
    from slotune.engine.sim.hardware import GPUS

    def profile(name: str) -> str:
        base = DERIVED_FROM.get(name)
        return f"scaled from {base}" if base else "fitted"

    if as_json:
        rows = [
            {
                "name": g.name,
                "description": g.description,
                "memory_gib": g.memory_gib,
                "hbm_gbps": g.hbm_gbps,
                "bf16_tflops": g.bf16_tflops,
                "fp8_tflops": g.fp8_tflops,
                "host_link_gbps": g.host_link_gbps,
                "interconnect_gbps": g.interconnect_gbps,
                "interconnect": g.interconnect,
                "profile": profile(g.name),
                "source": g.source,
            }
            for g in GPUS.values()
        ]
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="GPUs (datasheet figures; TFLOP/s dense, GB/s)")
    table.add_column("name", no_wrap=True)
    for col in ("GiB", "HBM", "BF16", "FP8", "host", "GPU link", "profile"):
        table.add_column(col, justify="left" if col in ("GPU link", "profile") else "right")
    for g in GPUS.values():
        table.add_row(
            g.name,
            f"{g.memory_gib:g}",
            f"{g.hbm_gbps:g}",
            f"{g.bf16_tflops:g}",
            "-" if g.fp8_tflops is None else f"{g.fp8_tflops:g}",
            f"{g.host_link_gbps:g}",
            f"{g.interconnect_gbps:g} ({g.interconnect})",
            profile(g.name),
        )
    Console().print(table)


def _weights_label(dense: str, experts: str | None) -> str:
    """``bf16``, or ``bf16/mxfp4`` where the experts are in another format."""
    return dense if experts in (None, dense) else f"{dense}/{experts}"


@app.command()
def models(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the models the simulator knows (any HF config.json path works too)."""
    from slotune.engine.sim.models import MODELS

    rows: list[_ModelRow] = [
        {
            "name": m.name,
            "layers": m.num_layers,
            "hidden_size": m.hidden_size,
            "num_heads": m.num_heads,
            "num_kv_heads": m.num_kv_heads,
            "head_dim": m.head_dim,
            "intermediate_size": m.intermediate_size,
            "vocab_size": m.vocab_size,
            "experts": None if m.moe is None else f"{m.moe.top_k}/{m.moe.num_experts}",
            "params_b": round(m.num_params / 1e9, 2),
            "active_params_b": round(m.active_params / 1e9, 2),
            "weight_dtype": m.weight_dtype,
            "expert_weight_dtype": None if m.moe is None else m.expert_weight_format.name,
            "weights_gb": round(m.weight_bytes / 1e9, 2),
            "kv_kib_per_token": m.kv_bytes_per_token / 1024,
        }
        for m in MODELS.values()
    ]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    # Two tables, each readable in 80 columns: the architecture, then the size.
    shape = Table(title="Models: architecture (experts top-k/all)", box=None, pad_edge=False)
    size = Table(
        title="Models: size (params in billions, KV in KiB per token)", box=None, pad_edge=False
    )
    for table in (shape, size):
        table.add_column("name", no_wrap=True, header_style="bold")
    for col in ("layers", "hidden", "heads q/kv", "FFN", "vocab", "experts"):
        shape.add_column(col, justify="right", no_wrap=True, header_style="bold")
    for col in ("params", "active", "weights", "GB", "KV"):
        size.add_column(col, justify="right", no_wrap=True, header_style="bold")
    for r in rows:
        shape.add_row(
            r["name"],
            str(r["layers"]),
            str(r["hidden_size"]),
            f"{r['num_heads']}/{r['num_kv_heads']}",
            str(r["intermediate_size"]),
            str(r["vocab_size"]),
            r["experts"] or "-",
        )
        size.add_row(
            r["name"],
            f"{r['params_b']:.2f}",
            f"{r['active_params_b']:.2f}",
            _weights_label(r["weight_dtype"], r["expert_weight_dtype"]),
            f"{r['weights_gb']:.1f}",
            f"{r['kv_kib_per_token']:g}",
        )
    console = Console()
    console.print(shape)
    console.print()
    console.print(size)


@app.command()
def estimate(
    gpu: str = typer.Option(..., "--gpu", help="GPU name (see `slotune gpus`) or profile JSON."),
    model: str = typer.Option(
        ..., "--model", help="Model name (see `slotune models`) or an HF config.json path."
    ),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel GPUs."),
    tokens: int = typer.Option(..., "--tokens", help="Prefill tokens in the step (one chunk)."),
    context: int = typer.Option(0, "--context", help="Tokens already cached before the chunk."),
    decode_batch: int = typer.Option(0, "--decode-batch", help="Decoding requests in the step."),
    decode_context: int = typer.Option(
        0, "--decode-context", help="Context tokens each decode reads."
    ),
    block_size: int = typer.Option(16, "--block-size", help="KV block size in tokens."),
    stack: str = typer.Option(
        None, "--stack", help="Serving stack: a name or JSON (default vllm-v1; eager: kernels)."
    ),
    kv_cache_dtype: str = typer.Option(
        "auto", "--kv-cache-dtype", help="KV-cache format: auto | fp8 | int8 | int4."
    ),
    quantization: str | None = typer.Option(
        None,
        "--quantization",
        help="Weight format: bf16 | fp8 | int8 | int4 | mxfp4 (default: the model's).",
    ),
    ep: int = typer.Option(1, "--ep", help="Expert-parallel GPUs among --tp (MoE models)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Estimate one step's time, per op and layer, on a simulated GPU."""
    from slotune.engine.kv_dtype import KV_CACHE_DTYPES
    from slotune.engine.sim.cost_model import CostModel
    from slotune.engine.sim.models import get_model
    from slotune.engine.sim.profile import load_profile
    from slotune.engine.sim.stack import load_stack

    for name, value in (
        ("--tokens", tokens),
        ("--context", context),
        ("--decode-batch", decode_batch),
        ("--decode-context", decode_context),
    ):
        if value < 0:
            fail(f"{name} must be >= 0 (got {value})")
    if tokens == 0 and decode_batch == 0:
        fail("the step is empty: give --tokens > 0 or --decode-batch > 0")
    if decode_batch and decode_context < 1:
        fail("--decode-context must be >= 1 when --decode-batch is given")
    if block_size < 1:
        fail(f"--block-size must be >= 1 (got {block_size})")
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        fail(f"--kv-cache-dtype: {kv_cache_dtype!r} is not one of {', '.join(KV_CACHE_DTYPES)}")
    try:
        profile = load_profile(gpu)
        spec = get_model(model, quantization)
        cm = CostModel(
            profile,
            spec,
            tp,
            block_size,
            load_stack(stack),
            ep=ep,
            kv_cache_dtype=kv_cache_dtype,
        )
    except ValueError as e:
        fail(str(e))
    from slotune.engine.sim.roofline import estimate_roofline, roofline_dict

    b = cm.breakdown(tokens, context, decode_batch, decode_context)
    roofline = estimate_roofline(cm, tokens, context, decode_batch, decode_context)
    per_layer_ms = {k: round(v * 1e3, 6) for k, v in b.per_layer.items()}
    per_step_ms = {k: round(v * 1e3, 6) for k, v in b.per_step.items()}
    step_ms = round(b.total * 1e3, 6)
    result = {
        "gpu": profile.gpu.name,
        "stack": cm.stack.name,
        "model": spec.name,
        "tp": tp,
        "tokens": tokens,
        "context": context,
        "decode_batch": decode_batch,
        "decode_context": decode_context,
        "block_size": block_size,
        "kv_cache_dtype": kv_cache_dtype,
        "weight_dtype": spec.weight_dtype,
        "expert_weight_dtype": None if spec.moe is None else spec.expert_weight_format.name,
        "ep": ep,
        "num_layers": spec.num_layers,
        "per_layer_ms": per_layer_ms,
        "per_step_ms": per_step_ms,
        "step_ms": step_ms,
        "roofline": roofline_dict(roofline),
    }
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    table = Table(
        title=f"{spec.name} on {tp} × {profile.gpu.name}: {tokens} prefill tokens "
        f"(after {context}) + {decode_batch} decodes (context {decode_context})"
    )
    table.add_column("op")
    table.add_column("ms per layer", justify="right")
    table.add_column(f"ms × {spec.num_layers} layers", justify="right")
    for op, ms in per_layer_ms.items():
        table.add_row(op, f"{ms:.4f}", f"{ms * spec.num_layers:.3f}")
    for op, ms in per_step_ms.items():
        if op != "layers":
            table.add_row(op, "", f"{ms:.3f}")
    table.add_row("[bold]step[/bold]", "", f"[bold]{step_ms:.3f}[/bold]")
    from slotune.cli.hardware import roofline_table

    console = Console()
    console.print(table)
    console.print(roofline_table(roofline, "The same step against the GPU"))
