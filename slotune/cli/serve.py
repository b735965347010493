"""``slotune serve``: the embedded engine behind an OpenAI-compatible HTTP API."""

from __future__ import annotations

from typing import Annotated

from rich.console import Console

from slotune.cli import engine_options as eo
from slotune.cli.app import app
from slotune.cli.common import fail, opt

DEFAULT_MAX_MODEL_LEN = 8192


@app.command()
def serve(
    model: Annotated[
        str | None, opt("--model", "Checkpoint folder to run (e.g. from `slotune init-model`).")
    ] = None,
    gpu: Annotated[
        str | None, opt("--gpu", "Simulate this GPU (`slotune gpus`) instead of running a model.")
    ] = None,
    sim_model: Annotated[str, opt("--sim-model", "Simulated model (with --gpu).")] = "llama-3-8b",
    tp: Annotated[int, opt("--tp", "Tensor-parallel GPUs (with --gpu).")] = 1,
    stack: eo.Stack = None,
    target_name: eo.TargetName = None,
    device: Annotated[str, opt("--device", "auto | cpu | cuda (with --model).")] = "auto",
    host: Annotated[str, opt("--host", "Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, opt("--port", "Port to listen on.")] = 8000,
    served_model_name: Annotated[
        str | None, opt("--served-model-name", "Model name clients send (default: --model).")
    ] = None,
    api_key: Annotated[
        str | None, opt("--api-key", "Require `Authorization: Bearer KEY` on /v1/* requests.")
    ] = None,
    max_queue: Annotated[
        int | None,
        opt(
            "--max-queue",
            "Answer 503 + Retry-After when a request's sequences (prompts x n) would make "
            "more than this many wait.",
        ),
    ] = None,
    drain_timeout: Annotated[
        float,
        opt(
            "--drain-timeout",
            "On SIGTERM/SIGINT, seconds to let requests in flight finish before they are cut "
            "(0: cut at once).",
        ),
    ] = 30.0,
    max_num_batched_tokens: eo.MaxNumBatchedTokens = None,
    long_prefill_token_threshold: eo.LongPrefillTokenThreshold = None,
    block_size: eo.BlockSize = None,
    max_num_seqs: eo.MaxNumSeqs = None,
    max_model_len: Annotated[
        int | None,
        opt("--max-model-len", f"Default: the model's context, at most {DEFAULT_MAX_MODEL_LEN}."),
    ] = None,
    preemption_mode: eo.PreemptionMode = None,
    prefix_caching: eo.PrefixCaching = None,
    policy: eo.Policy = None,
    num_gpu_blocks: eo.NumGpuBlocks = None,
    gpu_memory_utilization: eo.GpuMemoryUtilization = None,
    swap_space_gb: eo.SwapSpace = None,
    kv_cache_dtype: eo.KVCacheDtype = None,
    num_speculative_tokens: eo.NumSpeculativeTokens = None,
    prompt_lookup_min: eo.PromptLookupMin = None,
    prompt_lookup_max: eo.PromptLookupMax = None,
    scheduling_policy: eo.SchedulingPolicy = None,
    swap_threshold_tokens: eo.SwapThreshold = None,
    top_tier_kv_share: eo.TopTierKVShare = None,
    top_tier_token_share: eo.TopTierTokenShare = None,
    decode_budget_ms: eo.DecodeBudget = None,
    config: eo.ConfigJson = None,
) -> None:
    """Serve /v1/completions and /v1/chat/completions from slotune's engine.

    Also /v1/models, /tokenize, /detokenize, /version, /health and /metrics (Prometheus,
    vLLM's metric names). With --gpu the engine is simulated; responses are paced by its
    simulated step times, /metrics histograms hold simulated times, `seed` changes nothing
    and `stop_token_ids` are never sampled unless they cover every simulated token.
    """
    if (model is None) == (gpu is None):
        fail("give either --model PATH (a real checkpoint) or --gpu G [--sim-model M]")
    if max_queue is not None and max_queue < 0:
        fail(f"--max-queue must be >= 0 (got {max_queue})")
    if not drain_timeout >= 0:
        fail(f"--drain-timeout must be >= 0 seconds (got {drain_timeout})")
    try:
        stack = eo.resolve_stack(stack, target_name)
    except ValueError as exc:
        fail(f"--target: {exc}")
    overrides = eo.flag_overrides(locals())
    try:
        engine_config = eo.build_engine_config(
            config, overrides, lambda: _model_max_len(model, sim_model)
        )
    except ValueError as exc:
        fail(str(exc))
    from slotune.server import local_model, simulated_model
    from slotune.server import serve as run_server

    try:
        if model is not None:
            engine, served = local_model(
                engine_config, model, served_model_name=served_model_name, device=device
            )
            what = f"{model} on {device}"
        else:
            engine, served = simulated_model(
                engine_config,
                gpu=gpu or "",
                model=sim_model,
                tp=tp,
                served_model_name=served_model_name,
                stack=stack,
            )
            what = f"simulated {sim_model} on {gpu}" + (f" x{tp}" if tp > 1 else "")
    except (ValueError, FileNotFoundError) as exc:
        fail(str(exc))
    console = Console()
    console.print(
        f"serving [bold]{served.name}[/bold] ({what}) at http://{host}:{port}/v1  "
        f"max_model_len={engine_config.max_model_len}, "
        f"{engine.capacity.num_gpu_blocks} KV blocks of {engine_config.block_size}",
        highlight=False,
    )
    try:
        run_server(
            engine,
            served,
            host=host,
            port=port,
            api_key=api_key,
            max_queue=max_queue,
            drain_timeout_s=drain_timeout,
        )
    except OSError as exc:
        fail(f"--host/--port: cannot listen on {host}:{port}: {exc}")


def _model_max_len(model: str | None, sim_model: str) -> int:
    if model is not None:
        from slotune.server.served import checkpoint_max_len

        length = checkpoint_max_len(model)
    else:
        from slotune.engine.sim.models import get_model

        try:
            length = get_model(sim_model).max_position_embeddings
        except ValueError:
            length = None
    return min(length or DEFAULT_MAX_MODEL_LEN, DEFAULT_MAX_MODEL_LEN)
