"""Synthetic workloads: ShareGPT-like chat lengths, shared-prefix groups, agent sessions,
long-context prompts. Every generator is deterministic for a given seed.

Shared text is expressed as prompt segments with shared keys (see ``trace.py``), so shared
prefixes are real shared tokens and the traces stay small on disk.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from slotune.workloads.trace import Trace, TraceRequest


@dataclass(frozen=True)
class LengthDist:
    """A log-normal token count with the given mean, clipped by resampling to [low, high]."""

    mean: float
    sigma: float = 0.8
    low: int = 1
    high: int = 4096

    def __post_init__(self) -> None:
        if not self.mean > 0 or self.sigma < 0 or not 1 <= self.low <= self.high:
            raise ValueError(
                f"LengthDist: need mean > 0, sigma >= 0, 1 <= low <= high (got {self})"
            )

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.sigma == 0:
            return np.full(n, int(np.clip(round(self.mean), self.low, self.high)), dtype=np.int64)
        mu = np.log(self.mean) - self.sigma**2 / 2
        out = np.empty(0, dtype=np.int64)
        while len(out) < n:
            draw = np.rint(rng.lognormal(mu, self.sigma, size=2 * n + 16)).astype(np.int64)
            out = np.concatenate([out, draw[(draw >= self.low) & (draw <= self.high)]])
        return out[:n]


class _Keys:
    """Fresh segment keys; a shared text is one key used by many requests."""

    def __init__(self) -> None:
        self._next = 0

    def new(self) -> int:
        self._next += 1
        return self._next


def length_trace(
    name: str,
    num_requests: int,
    prompt: LengthDist,
    output: LengthDist,
    *,
    max_total: int,
    seed: int = 0,
    id_prefix: str = "r",
) -> Trace:
    """Independent requests with drawn prompt and output lengths, prompt + output capped at
    ``max_total`` (the output gives way)."""
    rng = np.random.default_rng(seed)
    prompts = prompt.sample(rng, num_requests)
    outputs = np.minimum(output.sample(rng, num_requests), max_total - prompts)
    reqs = tuple(
        TraceRequest(request_id=f"{id_prefix}{i}", prompt_len=int(p), output_len=int(o))
        for i, (p, o) in enumerate(zip(prompts, outputs, strict=True))
    )
    return Trace(name=name, requests=reqs, seed=seed)


def sharegpt_like(num_requests: int = 1000, *, seed: int = 0) -> Trace:
    """Lengths shaped like ShareGPT after vLLM's filters (Llama-3 tokenizer): means of about
    230 prompt and 200 output tokens, prompt 4..1024 and prompt + output <= 2048."""
    return length_trace(
        "sharegpt-like",
        num_requests,
        LengthDist(mean=330, sigma=1.1, low=4, high=1024),
        LengthDist(mean=228, sigma=0.95, low=4, high=1024),
        max_total=2048,
        seed=seed,
        id_prefix="sg",
    )


def shared_prefix(
    num_groups: int = 8,
    requests_per_group: int = 40,
    *,
    system_prompt_len: int = 1536,
    question: LengthDist = LengthDist(mean=120, sigma=0.6, low=8, high=512),
    output: LengthDist = LengthDist(mean=150, sigma=0.7, low=8, high=768),
    seed: int = 0,
    interleave: bool = True,
) -> Trace:
    """Groups of requests that share a long system prompt, each with its own question."""
    rng = np.random.default_rng(seed)
    keys = _Keys()
    systems = [keys.new() for _ in range(num_groups)]
    n = num_groups * requests_per_group
    q_lens, o_lens = question.sample(rng, n), output.sample(rng, n)
    order = (
        [(g, j) for j in range(requests_per_group) for g in range(num_groups)]
        if interleave
        else [(g, j) for g in range(num_groups) for j in range(requests_per_group)]
    )
    reqs = []
    for i, (g, j) in enumerate(order):
        q = int(q_lens[i])
        reqs.append(
            TraceRequest(
                request_id=f"sp{g}-{j}",
                prompt_len=system_prompt_len + q,
                output_len=int(o_lens[i]),
                prompt_segments=((systems[g], system_prompt_len), (keys.new(), q)),
            )
        )
    return Trace(name="shared-prefix", requests=tuple(reqs), seed=seed)


@dataclass(frozen=True)
class AgentParams:
    """Tool-using agent sessions.

    ``num_agents`` distinct agents (system prompt + tool definitions) are shared by all
    sessions; each session starts with a task, and each later turn appends the tool's
    result to the history (the runner puts the previous answer before it). The next turn
    is sent ``tool_latency_s`` after the previous answer finishes.
    """

    num_sessions: int = 48
    turns: tuple[int, int] = (3, 8)
    num_agents: int = 2
    system_prompt_len: int = 800
    tools_len: int = 1200
    task: LengthDist = LengthDist(mean=150, sigma=0.6, low=16, high=1024)
    tool_result: LengthDist = LengthDist(mean=250, sigma=0.9, low=8, high=2048)
    output: LengthDist = LengthDist(mean=120, sigma=0.7, low=8, high=1024)
    tool_latency_mean_s: float = 1.0
    tool_latency_sigma: float = 0.8
    max_context_len: int = 8192


def agent_sessions(params: AgentParams = AgentParams(), *, seed: int = 0) -> Trace:
    """Sessions in trace order; a session ends early rather than pass ``max_context_len``."""
    rng = np.random.default_rng(seed)
    keys = _Keys()
    agents = [(keys.new(), keys.new()) for _ in range(params.num_agents)]
    lo, hi = params.turns
    reqs: list[TraceRequest] = []
    for s in range(params.num_sessions):
        system, tools = agents[s % params.num_agents]
        num_turns = int(rng.integers(lo, hi + 1))
        task = int(params.task.sample(rng, 1)[0])
        outputs = params.output.sample(rng, num_turns)
        results = params.tool_result.sample(rng, num_turns)
        mu = np.log(params.tool_latency_mean_s) - params.tool_latency_sigma**2 / 2
        latency = rng.lognormal(mu, params.tool_latency_sigma, size=num_turns)
        context = params.system_prompt_len + params.tools_len + task
        parent: str | None = None
        segments: tuple[tuple[int, int], ...]
        for t in range(num_turns):
            if t == 0:
                segments = (
                    (system, params.system_prompt_len),
                    (tools, params.tools_len),
                    (keys.new(), task),
                )
                own, think = context, 0.0
            else:
                own = int(results[t])
                segments = ((keys.new(), own),)
                think = round(float(latency[t]), 3)
                context += own
            if context + int(outputs[t]) > params.max_context_len:
                break
            rid = f"ag{s}-t{t}"
            reqs.append(
                TraceRequest(
                    request_id=rid,
                    prompt_len=own,
                    output_len=int(outputs[t]),
                    prompt_segments=segments,
                    session_id=f"ag{s}",
                    turn=t,
                    think_time_s=think,
                    parent_id=parent,
                )
            )
            context += int(outputs[t])
            parent = rid
    return Trace(name="agent", requests=tuple(reqs), seed=seed)


def with_tiers(trace: Trace, pro_share: float, *, seed: int, name: str) -> Trace:
    """``trace`` with each session (or lone request) drawn into tier 0 (pro) with
    probability ``pro_share``, else tier 1 (free); every turn of a session keeps its
    tier, and its priority is its tier (pro first under priority scheduling)."""
    if not 0 < pro_share < 1:
        raise ValueError(f"pro_share must be in (0, 1) (got {pro_share})")
    rng = np.random.default_rng(seed)
    tier_of: dict[str, int] = {}
    reqs = []
    for r in trace.requests:
        key = r.session_id if r.session_id is not None else r.request_id
        if key not in tier_of:
            tier_of[key] = 0 if rng.random() < pro_share else 1
        tier = tier_of[key]
        reqs.append(replace(r, tier=tier, priority=tier))
    return replace(trace, name=name, requests=tuple(reqs), _cache={})


def long_context(
    num_requests: int = 200,
    *,
    prompt: LengthDist = LengthDist(mean=4000, sigma=0.4, low=2048, high=7168),
    output: LengthDist = LengthDist(mean=200, sigma=0.6, low=16, high=800),
    seed: int = 0,
) -> Trace:
    """Long prompts (document QA, RAG) with short answers, all within 8192 tokens."""
    rng = np.random.default_rng(seed)
    p, o = prompt.sample(rng, num_requests), output.sample(rng, num_requests)
    o = np.minimum(o, 8192 - p)
    reqs = tuple(
        TraceRequest(request_id=f"lc{i}", prompt_len=int(a), output_len=int(b))
        for i, (a, b) in enumerate(zip(p, o, strict=True))
    )
    return Trace(name="long-context", requests=reqs, seed=seed)


@dataclass(frozen=True)
class ClippedNormal:
    """inference-perf's length ``Distribution``: a normal draw, rounded, clipped to
    ``[low, high]``; ``std_dev`` 0 is the constant ``mean``."""

    mean: float
    std_dev: float = 0.0
    low: int = 1
    high: int = 1 << 20

    def __post_init__(self) -> None:
        if not self.mean >= 1 or self.std_dev < 0 or not 1 <= self.low <= self.high:
            raise ValueError(
                f"ClippedNormal: need mean >= 1, std_dev >= 0, 1 <= low <= high (got {self})"
            )

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        draw = (
            rng.normal(self.mean, self.std_dev, size=n) if self.std_dev else np.full(n, self.mean)
        )
        return np.clip(np.rint(draw), self.low, self.high).astype(np.int64)


@dataclass(frozen=True)
class SharedPrefixParams:
    """inference-perf's ``shared_prefix`` data: ``num_groups`` system prompts, each shared
    by ``num_prompts_per_group`` users with a question of their own (its defaults).

    With ``multi_turn`` (inference-perf's ``enable_multi_turn_chat``) every user is a
    session of ``num_turns`` rounds: each round sends the user's question after the
    history (system prompt, earlier questions and the engine's answers), as
    inference-perf's user sessions do. Without it each user sends one request, system
    prompt + question.
    """

    num_groups: int = 10
    num_prompts_per_group: int = 10
    system_prompt_len: int = 100
    question_len: ClippedNormal = ClippedNormal(50)
    output_len: ClippedNormal = ClippedNormal(50)
    multi_turn: bool = False
    num_turns: int = 1

    def __post_init__(self) -> None:
        if min(self.num_groups, self.num_prompts_per_group, self.system_prompt_len) < 1:
            raise ValueError(f"SharedPrefixParams: groups, users and lengths must be >= 1 ({self})")
        if self.num_turns < 1 or (self.num_turns > 1 and not self.multi_turn):
            raise ValueError("SharedPrefixParams.num_turns: >= 1, and above 1 only with multi_turn")


def inference_perf_shared_prefix(
    params: SharedPrefixParams = SharedPrefixParams(), *, seed: int = 0
) -> Trace:
    """Users in trace order shuffled with the seed (inference-perf shuffles them too)."""
    rng = np.random.default_rng(seed)
    keys = _Keys()
    users: list[tuple[int, int, int, list[int]]] = []
    for _ in range(params.num_groups):
        system = keys.new()
        questions = params.question_len.sample(rng, params.num_prompts_per_group)
        outputs = params.output_len.sample(rng, params.num_prompts_per_group * params.num_turns)
        for u, q in enumerate(questions):
            answers = outputs[u * params.num_turns : (u + 1) * params.num_turns]
            users.append((system, keys.new(), int(q), [int(a) for a in answers]))
    order = rng.permutation(len(users))
    reqs: list[TraceRequest] = []
    for n, u in enumerate(order):
        system, question, q, answers = users[u]
        parent: str | None = None
        for turn, answer in enumerate(answers):
            segments: tuple[tuple[int, int], ...] = (
                ((system, params.system_prompt_len),) if turn == 0 else ()
            )
            segments += ((question, q),)
            rid = f"ip{n}-t{turn}" if params.multi_turn else f"ip{n}"
            reqs.append(
                TraceRequest(
                    request_id=rid,
                    prompt_len=sum(length for _, length in segments),
                    output_len=answer,
                    prompt_segments=segments,
                    session_id=f"user{n}" if params.multi_turn else None,
                    turn=turn,
                    parent_id=parent,
                )
            )
            parent = rid
    return Trace(name="inference-perf-shared-prefix", requests=tuple(reqs), seed=seed)


def reasoning(
    num_requests: int = 300,
    *,
    prompt: LengthDist = LengthDist(mean=200, sigma=0.8, low=16, high=2048),
    output: LengthDist = LengthDist(mean=4000, sigma=0.7, low=512, high=16384),
    seed: int = 0,
) -> Trace:
    """Reasoning-model traffic: short prompts, long outputs (thinking then the answer),
    as math and coding questions to an R1-style model give (thousands of tokens)."""
    return length_trace(
        "reasoning", num_requests, prompt, output, max_total=18432, seed=seed, id_prefix="rs"
    )
