"""``slotune serve``: the embedded engine behind an OpenAI-compatible HTTP API."""

from __future__ import annotations

from typing import Annotated

from rich.console import Console

from slotune.cli import engine_options as eo
from slotune.cli.app import app
from slotune.cli.common import fail, opt


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
        opt("--max-model-len", "Default: the model's context, at most 8192."),
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
    speculative_model: eo.SpeculativeModel = None,
    speculative_acceptance: eo.SpeculativeAcceptance = None,
    scheduling_policy: eo.SchedulingPolicy = None,
    swap_threshold_tokens: eo.SwapThreshold = None,
    top_tier_kv_share: eo.TopTierKVShare = None,
    top_tier_token_share: eo.TopTierTokenShare = None,
    decode_budget_ms: eo.DecodeBudget = None,
    adaptive_chunk_ms: eo.AdaptiveChunk = None,
    config: eo.ConfigJson = None,
) -> None:
    """Serve /v1/completions and /v1/chat/completions from slotune's engine.

    Also /v1/models, /tokenize, /detokenize, /version, /health and /metrics (Prometheus,
    vLLM's metric names). With --gpu the engine is simulated; responses are paced by its
    simulated step times, /metrics histograms hold simulated times, `seed` changes nothing
    and `stop_token_ids` are never sampled unless they cover every simulated token.
    """
    from slotune.engine.knobs import EngineKnobs
    from slotune.server.launch import ServeError, ServeRequest, Serving, launch

    request = ServeRequest(
        model=model,
        gpu=gpu,
        sim_model=sim_model,
        tp=tp,
        stack=stack,
        target=target_name,
        device=device,
        host=host,
        port=port,
        served_model_name=served_model_name,
        api_key=api_key,
        max_queue=max_queue,
        drain_timeout=drain_timeout,
        knobs=EngineKnobs(
            max_num_batched_tokens=max_num_batched_tokens,
            long_prefill_token_threshold=long_prefill_token_threshold,
            block_size=block_size,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            preemption_mode=preemption_mode,
            prefix_caching=prefix_caching,
            policy=policy,
            num_gpu_blocks=num_gpu_blocks,
            gpu_memory_utilization=gpu_memory_utilization,
            swap_space_gb=swap_space_gb,
            kv_cache_dtype=kv_cache_dtype,
            num_speculative_tokens=num_speculative_tokens,
            prompt_lookup_min=prompt_lookup_min,
            prompt_lookup_max=prompt_lookup_max,
            speculative_model=speculative_model,
            speculative_acceptance=speculative_acceptance,
            scheduling_policy=scheduling_policy,
            swap_threshold_tokens=swap_threshold_tokens,
            top_tier_kv_share=top_tier_kv_share,
            top_tier_token_share=top_tier_token_share,
            decode_budget_ms=decode_budget_ms,
            adaptive_chunk_ms=adaptive_chunk_ms,
        ),
        config=config,
    )

    def ready(s: Serving) -> None:
        Console().print(
            f"serving [bold]{s.name}[/bold] ({s.what}) at {s.url}  "
            f"max_model_len={s.max_model_len}, {s.num_gpu_blocks} KV blocks of {s.block_size}",
            highlight=False,
        )

    try:
        launch(request, on_ready=ready)
    except ServeError as exc:
        fail(str(exc))
