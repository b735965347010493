"""The search space: which engine knobs the tuner varies, over which values.

Seven knobs are searched by default (issue 5), and ``kv_cache_dtype`` among the KV formats
the GPU serves (``GpuSpec.kv_cache_dtypes``: auto and fp8 where it has FP8 tensor cores);
every other ``EngineConfig`` field is fixed, ``max_model_len`` at the longest request of
the trace. The model's weight precision is given, not searched. A ``--search`` file (YAML or JSON)
fixes or narrows any of them, or fixes any other field::

    max_num_batched_tokens: {low: 1024, high: 8192}   # narrow (log scale, step 128 kept)
    block_size: 16                                    # fix
    prefix_caching: [hash, radix]                     # choose among
    long_prefill_token_threshold: off                 # fix (0 and "off" mean off)
    gpu_memory_utilization: 0.85                      # fix a field that is not searched
    num_speculative_tokens: [0, 2, 4]                 # opt in: n-gram speculation (0 = off)
    speculative_model: /ckpt/draft                    # a draft model: searches k in 0, 2, 4

Conditional knobs are Optuna conditionals, so every trial is a valid ``EngineConfig``:
the long-prefill threshold exists only under the chunked policy (a gate picks off or on,
then the value; a threshold at or above the budget is off, since a chunk never exceeds the
remaining budget), and ``prefill_first``, which never splits a prompt, raises a budget
below ``max_model_len`` to it. Optuna cannot combine a log scale with a step, so a stepped
log range is suggested on a log scale and rounded to the step.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from slotune.engine.config import EngineConfig
from slotune.engine.kv_dtype import KV_CACHE_DTYPES
from slotune.targets.base import Target

THRESHOLD_GATE = "long_prefill_token_threshold_on"
"""Optuna parameter that switches the long-prefill threshold on (chunked policy only)."""

_CATEGORICAL = {
    "preemption_mode": ("recompute", "swap", "hybrid"),
    "scheduling_policy": ("fcfs", "priority"),
    "prefix_caching": ("none", "hash", "radix"),
    "policy": ("chunked", "prefill_first"),
    "kv_cache_dtype": KV_CACHE_DTYPES,
}
_SEARCH_ORDER = (
    "policy",
    "max_num_batched_tokens",
    "long_prefill_token_threshold",
    "block_size",
    "max_num_seqs",
    "preemption_mode",
    "prefix_caching",
    "kv_cache_dtype",
    "num_speculative_tokens",  # off (fixed at 0) unless a search file opts in
    "swap_threshold_tokens",
    "scheduling_policy",
    "top_tier_kv_share",
    "top_tier_token_share",
    "decode_budget_ms",
    "adaptive_chunk_ms",
)
OPT_IN = (
    "num_speculative_tokens",
    "swap_threshold_tokens",
    "scheduling_policy",
    "top_tier_kv_share",
    "top_tier_token_share",
    "decode_budget_ms",
    "adaptive_chunk_ms",
)
_FRACTIONS = ("top_tier_kv_share", "top_tier_token_share")  # in [0, 1)
"""Knobs fixed at their ``EngineConfig`` default unless a ``--search`` file lists values
(``preemption_mode: [recompute, hybrid]``, ``swap_threshold_tokens: [1024, 4096]``,
``scheduling_policy: [fcfs, priority]``, ``top_tier_kv_share: [0, 0.2]``,
``decode_budget_ms: [0, 50]``, ``adaptive_chunk_ms: [0, 30, 40]``); hybrid preemption,
tier quotas, the decode budget and adaptive chunking run on the embedded engine only,
priority scheduling also on vLLM and SGLang."""
DRAFT_TOKENS = (0, 2, 4)
"""``num_speculative_tokens`` searched where a draft model is fixed and no values given."""
_RANGE_KEYS = {"low", "high", "log", "step", "allow_off"}
_GRID_LINEAR_POINTS = 5


class SearchSpaceError(ValueError):
    """A search space that cannot be searched (bad override file, nothing left to vary)."""


@dataclass(frozen=True)
class Param:
    """One searched knob: a set of ``values``, or an integer range ``low``..``high``.

    ``allow_off`` (the long-prefill threshold only) adds 0 = off as a choice besides the range.
    """

    name: str
    values: tuple[Any, ...] | None = None
    low: int | None = None
    high: int | None = None
    log: bool = False
    step: int = 1
    allow_off: bool = False

    @property
    def is_range(self) -> bool:
        return self.values is None

    @property
    def is_fixed(self) -> bool:
        if self.is_range:
            return False
        assert self.values is not None
        return len(self.values) == 1

    def to_dict(self) -> dict[str, Any]:
        if not self.is_range:
            return {"values": list(self.values or ())}
        return {
            "low": self.low,
            "high": self.high,
            "log": self.log,
            "step": self.step,
            "allow_off": self.allow_off,
        }

    def grid_values(self) -> list[int]:
        """Range points for an exhaustive grid: doublings on a log scale, else 5 even steps."""
        if not self.is_range:
            return list(self.values or ())
        assert self.low is not None and self.high is not None
        points: list[int] = []
        if self.log:
            v = self.low
            while v < self.high:
                points.append(v)
                v *= 2
        else:
            n = _GRID_LINEAR_POINTS
            points = [self.low + (self.high - self.low) * i // (n - 1) for i in range(n)]
        points.append(self.high)
        return sorted({_round_to_step(p, self.step, self.low, self.high) for p in points})


def default_params(
    kv_cache_dtypes: tuple[str, ...] = ("auto",),
    target: Target | None = None,
    max_model_len: int | None = None,
) -> dict[str, Param]:
    """Issue 5's default space narrowed to what ``target`` runs (None: every value, as
    slotune's engine), with the KV-cache formats the GPU serves and a long-prefill
    threshold below ``max_model_len`` (one at or above it never splits a prompt)."""
    values: dict[str, tuple[Any, ...]] = dict(_CATEGORICAL)
    values["block_size"] = (8, 16, 32, 64, 128, 256)
    seqs_high = 1024
    threshold_high = 32768
    if target is not None:
        values.update(target.knob_values)
        seqs_high = target.max_num_seqs_high
        if not target.gpu_kv_only:
            kv_cache_dtypes = target.knob_values["kv_cache_dtype"]
    kv = tuple(v for v in values["kv_cache_dtype"] if v in kv_cache_dtypes) or ("auto",)
    if max_model_len is not None:
        threshold_high = max(64, min(threshold_high, max_model_len - 1))
    threshold = Param(
        "long_prefill_token_threshold", low=64, high=threshold_high, log=True, allow_off=True
    )
    if target is not None and not target.long_prefill_threshold:
        threshold = Param("long_prefill_token_threshold", values=(0,))
    return {
        "max_num_batched_tokens": Param(
            "max_num_batched_tokens", low=256, high=32768, log=True, step=128
        ),
        "long_prefill_token_threshold": threshold,
        "block_size": Param("block_size", values=tuple(values["block_size"])),
        "preemption_mode": Param("preemption_mode", values=tuple(values["preemption_mode"])),
        "max_num_seqs": Param("max_num_seqs", low=8, high=seqs_high, log=True),
        "prefix_caching": Param("prefix_caching", values=tuple(values["prefix_caching"])),
        "policy": Param("policy", values=tuple(values["policy"])),
        "kv_cache_dtype": Param("kv_cache_dtype", values=kv),
        **{n: Param(n, values=(getattr(EngineConfig, n),)) for n in OPT_IN},
    }


@dataclass(frozen=True)
class SearchSpace:
    """The searched knobs and the fixed ``EngineConfig`` fields every trial shares."""

    params: dict[str, Param]
    fixed: dict[str, Any] = field(default_factory=dict)
    budget_ge_seqs: bool = False  # the target needs max_num_batched_tokens >= max_num_seqs

    @property
    def max_model_len(self) -> int:
        return int(self.fixed.get("max_model_len", EngineConfig.max_model_len))

    @property
    def free_names(self) -> list[str]:
        return [n for n in _SEARCH_ORDER if not self.params[n].is_fixed]

    def suggest(self, trial: Any) -> EngineConfig:
        """Ask an Optuna trial for one configuration."""
        return self.config_from_params(self._suggest_params(trial))

    def _suggest_params(self, trial: Any) -> dict[str, Any]:
        chosen: dict[str, Any] = {}
        for name in _SEARCH_ORDER:
            p = self.params[name]
            if name == "long_prefill_token_threshold":
                if chosen.get("policy", self._fixed_value("policy")) != "chunked":
                    continue
                gated = p.is_range and p.allow_off
                if gated and not trial.suggest_categorical(THRESHOLD_GATE, [False, True]):
                    continue
            if p.is_fixed:
                continue
            if p.is_range:
                assert p.low is not None and p.high is not None
                chosen[name] = trial.suggest_int(
                    name, p.low, p.high, log=p.log, step=1 if p.log else p.step
                )
            else:
                chosen[name] = trial.suggest_categorical(name, list(p.values or ()))
        return chosen

    def _fixed_value(self, name: str) -> Any:
        p = self.params[name]
        if p.is_fixed:
            assert p.values is not None
            return p.values[0]
        return None

    def config_from_params(self, params: dict[str, Any]) -> EngineConfig:
        """The configuration of a trial's Optuna parameters (absent ones fixed or off)."""
        knobs: dict[str, Any] = {}
        for name in _SEARCH_ORDER:
            p = self.params[name]
            if name in params:
                value = params[name]
                if p.is_range:
                    assert p.low is not None and p.high is not None
                    value = _round_to_step(int(value), p.step, p.low, p.high)
                knobs[name] = value
            elif p.is_fixed:
                knobs[name] = self._fixed_value(name)
        policy = knobs.get("policy", "chunked")
        budget = int(knobs["max_num_batched_tokens"])
        if policy == "prefill_first":
            knobs["max_num_batched_tokens"] = max(budget, self._prefill_first_budget())
            knobs["long_prefill_token_threshold"] = 0
            knobs["adaptive_chunk_ms"] = 0.0  # adaptive chunking splits prompts: chunked only
        else:
            threshold = int(knobs.get("long_prefill_token_threshold", 0) or 0)
            if params.get(THRESHOLD_GATE) is False or threshold >= min(budget, self.max_model_len):
                threshold = 0  # caps nothing (EngineConfig.chunk_cap)
            knobs["long_prefill_token_threshold"] = threshold
        if self.budget_ge_seqs and "max_num_seqs" in knobs:
            knobs["max_num_seqs"] = min(int(knobs["max_num_seqs"]), knobs["max_num_batched_tokens"])
        return EngineConfig(**{**self.fixed, **knobs})

    def params_for(self, config: EngineConfig) -> dict[str, Any] | None:
        """The Optuna parameters that give ``config``, or None when it lies outside the space
        (used to enqueue the baseline as the first trial)."""
        values = config.to_dict()
        params: dict[str, Any] = {}
        for name in _SEARCH_ORDER:
            p = self.params[name]
            if p.is_fixed:
                continue
            value = values[name]
            if name == "long_prefill_token_threshold":
                if values["policy"] != "chunked":
                    continue
                if p.is_range and p.allow_off:
                    params[THRESHOLD_GATE] = value != 0
                    if value == 0:
                        continue
            params[name] = value
        try:
            same = self.config_from_params(params) == config
        except (ValueError, TypeError, KeyError):
            return None
        inside = all(self._contains(n, v) for n, v in params.items() if n != THRESHOLD_GATE)
        return params if same and inside else None

    def _contains(self, name: str, value: Any) -> bool:
        p = self.params[name]
        if not p.is_range:
            return value in (p.values or ())
        assert p.low is not None and p.high is not None
        return p.low <= value <= p.high and value % p.step == 0

    def _prefill_first_budget(self) -> int:
        """The smallest budget on the range's step that holds a whole max_model_len prompt."""
        p = self.params["max_num_batched_tokens"]
        step = p.step if p.is_range else 1
        return -(-self.max_model_len // step) * step

    def grid(self) -> list[dict[str, Any]]:
        """Every distinct configuration of a discretized space, as Optuna parameters.

        Ranges become doublings (log) or five even steps; the threshold gate and the
        prefill-first budget rule are applied, and configurations that coincide are kept once.
        """
        names = [n for n in _SEARCH_ORDER if n != "long_prefill_token_threshold"]
        axes = [
            self.params[n].grid_values() if not self.params[n].is_fixed else [None] for n in names
        ]
        threshold = self.params["long_prefill_token_threshold"]
        out: list[dict[str, Any]] = []
        seen: set[str] = set()
        for combo in itertools.product(*axes):
            base = {n: v for n, v in zip(names, combo, strict=True) if v is not None}
            for params in self._threshold_variants(base, threshold):
                key = json.dumps(self.config_from_params(params).to_dict(), sort_keys=True)
                if key not in seen:
                    seen.add(key)
                    out.append(params)
        return out

    def _threshold_variants(self, base: dict[str, Any], p: Param) -> list[dict[str, Any]]:
        policy = base.get("policy", self._fixed_value("policy"))
        if policy != "chunked" or p.is_fixed:
            return [base]
        if not p.is_range:
            return [{**base, p.name: v} for v in p.values or ()]
        budget = base.get("max_num_batched_tokens", self._fixed_value("max_num_batched_tokens"))
        variants = [{**base, THRESHOLD_GATE: False}] if p.allow_off else []
        for v in p.grid_values():
            if v < int(budget):
                on = {THRESHOLD_GATE: True} if p.allow_off else {}
                variants.append({**base, **on, p.name: v})
        return variants or [base]

    def to_dict(self) -> dict[str, Any]:
        return {
            "params": {n: p.to_dict() for n, p in self.params.items()},
            "fixed": dict(self.fixed),
            "budget_ge_seqs": self.budget_ge_seqs,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SearchSpace:
        params = {}
        for name, spec in data["params"].items():
            if "values" in spec:
                params[name] = Param(name, values=tuple(spec["values"]))
            else:
                params[name] = Param(name, **spec)
        fixed = dict(data.get("fixed", {}))
        for name in ("kv_cache_dtype", *OPT_IN):  # a space stored before the knob was searched
            if name not in params:
                value = fixed.pop(name, getattr(EngineConfig, name))
                params[name] = Param(name, values=(value,))
        return cls(params, fixed, bool(data.get("budget_ge_seqs", False)))


def build_space(
    *,
    max_model_len: int,
    overrides: dict[str, Any] | None = None,
    where: str = "search space",
    kv_cache_dtypes: tuple[str, ...] = ("auto",),
    target: Target | None = None,
) -> SearchSpace:
    """The default space of ``target`` (None: every value) with ``max_model_len`` fixed
    and ``overrides`` applied; ``kv_cache_dtypes`` are the KV formats searched unless an
    override says otherwise. An override may only name values the target runs.

    Raises ``SearchSpaceError`` naming ``where`` when an override is invalid or when
    nothing is left to search.
    """
    params = default_params(kv_cache_dtypes, target, max_model_len)
    allowed = dict(_CATEGORICAL)
    if target is not None:
        allowed.update(target.knob_values)
    fixed: dict[str, Any] = {"max_model_len": max_model_len}
    known = {f.name for f in fields(EngineConfig)}
    for name, spec in (overrides or {}).items():
        if name == "long_prefill_token_threshold" and target and not target.long_prefill_threshold:
            if spec not in (0, "off", False, [0], ["off"]):
                raise SearchSpaceError(
                    f"{where}: {name}: {target.name} has no per-request long-prefill threshold"
                )
            continue
        if name in params:
            params[name] = _override(params[name], spec, where, allowed, target)
        elif name in known:
            fixed[name] = spec
        else:
            raise SearchSpaceError(
                f"{where}: unknown parameter {name!r}; searchable: {', '.join(_SEARCH_ORDER)}; "
                f"other EngineConfig fields can be fixed: {', '.join(sorted(known - set(params)))}"
            )
    if fixed.get("speculative_model"):
        given = "num_speculative_tokens" in (overrides or {})
        params = _with_draft_model(params, given, where, target)
    space = SearchSpace(params, fixed, bool(target and target.budget_ge_seqs))
    try:
        EngineConfig(**fixed)
    except (TypeError, ValueError) as e:
        raise SearchSpaceError(f"{where}: {e}") from None
    space = _drop_impossible_choices(space, where)
    if not space.free_names:
        raise SearchSpaceError(
            f"{where}: empty search space: every parameter is fixed; leave at least one of "
            f"{', '.join(_SEARCH_ORDER)} free (a range or two or more values)"
        )
    return space


def _with_draft_model(
    params: dict[str, Param], given: bool, where: str, target: Target | None
) -> dict[str, Param]:
    """A fixed draft model searches ``num_speculative_tokens`` (``DRAFT_TOKENS`` unless
    ``given``), under the policies the target runs a draft model with."""
    params = dict(params)
    if not given:
        params["num_speculative_tokens"] = Param("num_speculative_tokens", DRAFT_TOKENS)
    allowed = target.draft_policies if target is not None else None
    if allowed is None:
        return params
    policy = params["policy"]
    kept = tuple(v for v in policy.values or () if v in allowed)
    if not kept:
        note = target.draft_note if target is not None else ""
        raise SearchSpaceError(
            f"{where}: speculative_model: {target.name if target else ''} does not run a "
            f"draft model with policy {', '.join(map(str, policy.values or ()))}: {note}"
        )
    params["policy"] = replace(policy, values=kept)
    return params


def load_search_file(path: str | Path) -> dict[str, Any]:
    """Read a ``--search`` override file (YAML or JSON mapping)."""
    import yaml

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise SearchSpaceError(f"{p}: cannot read the search file ({e.strerror})") from None
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        raise SearchSpaceError(
            f"{p}: not valid {'JSON' if p.suffix == '.json' else 'YAML'}: {str(e).splitlines()[0]}"
        ) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SearchSpaceError(
            f"{p}: the search file must be a mapping of parameter names to values, lists or "
            f"{{low, high}} ranges (got {type(data).__name__})"
        )
    return data


def _override(
    default: Param,
    spec: Any,
    where: str,
    allowed: dict[str, tuple[Any, ...]],
    target: Target | None,
) -> Param:
    name = default.name
    at = f"{where}: {name}"
    if isinstance(spec, dict):
        unknown = set(spec) - _RANGE_KEYS
        if unknown:
            raise SearchSpaceError(
                f"{at}: unknown key(s) {sorted(unknown)}; a range takes {sorted(_RANGE_KEYS)}"
            )
        if not default.is_range:
            raise SearchSpaceError(f"{at}: takes a value or a list of values, not a range")
        merged = {**default.to_dict(), **spec}
        if name == "long_prefill_token_threshold" and "high" not in spec:
            merged["high"] = default.high
        for key in ("low", "high", "step"):
            if not _is_int(merged[key]) or merged[key] < 1:
                raise SearchSpaceError(
                    f"{at}: {key} must be a positive integer (got {merged[key]!r})"
                )
        for key in ("log", "allow_off"):
            if not isinstance(merged[key], bool):
                raise SearchSpaceError(f"{at}: {key} must be true or false (got {merged[key]!r})")
        if name != "long_prefill_token_threshold" and merged["allow_off"]:
            raise SearchSpaceError(f"{at}: allow_off applies to long_prefill_token_threshold only")
        low = -(-merged["low"] // merged["step"]) * merged["step"]
        high = merged["high"] // merged["step"] * merged["step"]
        if low > high:
            raise SearchSpaceError(
                f"{at}: empty range: no multiple of {merged['step']} lies in "
                f"[{merged['low']}, {merged['high']}]"
            )
        return Param(
            name,
            low=low,
            high=high,
            log=merged["log"],
            step=merged["step"],
            allow_off=merged["allow_off"],
        )
    values = spec if isinstance(spec, list) else [spec]
    if not values:
        raise SearchSpaceError(f"{at}: empty list of values; give at least one")
    checked = tuple(dict.fromkeys(_check_value(name, v, at, allowed, target) for v in values))
    return Param(name, values=checked)


def _check_value(
    name: str,
    value: Any,
    at: str,
    allowed: dict[str, tuple[Any, ...]] | None = None,
    target: Target | None = None,
) -> Any:
    allowed = allowed or _CATEGORICAL
    if name in allowed and (name in _CATEGORICAL or target is not None):
        if value not in allowed[name]:
            runs = ", ".join(map(str, allowed[name]))
            if target is not None:
                raise SearchSpaceError(
                    f"{at}: {target.name} does not run {value!r} (it runs {runs})"
                )
            raise SearchSpaceError(f"{at}: {value!r} is not one of {runs}")
        return value
    if name == "long_prefill_token_threshold" and (value is False or value in ("off", 0)):
        return 0
    if name == "num_speculative_tokens" and _is_int(value) and value == 0:
        return 0
    if name in _FRACTIONS or name in ("decode_budget_ms", "adaptive_chunk_ms"):
        most = 1.0 if name in _FRACTIONS else float("inf")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SearchSpaceError(f"{at}: {value!r} is not a number")
        if not 0 <= value < most:
            raise SearchSpaceError(f"{at}: {value!r} is out of range [0, {most:g})")
        return value
    if not _is_int(value) or value < 1:
        raise SearchSpaceError(f"{at}: {value!r} is not a positive integer")
    if name == "block_size" and value & (value - 1):
        raise SearchSpaceError(f"{at}: {value} is not a power of two")
    return value


def _drop_impossible_choices(space: SearchSpace, where: str) -> SearchSpace:
    """Remove choices no valid configuration can take (so no trial is ever invalid)."""
    params = dict(space.params)
    budget = params["max_num_batched_tokens"]
    if budget.is_range:
        assert budget.high is not None
        most = budget.high
    else:
        most = int(max(budget.values or (0,)))
    policy = params["policy"]
    if "prefill_first" in (policy.values or ()) and most < space.max_model_len:
        kept = tuple(v for v in policy.values or () if v != "prefill_first")
        if not kept:
            raise SearchSpaceError(
                f"{where}: policy prefill_first never splits a prompt, so it needs "
                f"max_num_batched_tokens >= max_model_len={space.max_model_len}, but the "
                f"space allows at most {most}"
            )
        params["policy"] = replace(policy, values=kept)
    swap_gb = space.fixed.get("swap_space_gb", EngineConfig.swap_space_gb)
    mode = params["preemption_mode"]
    if swap_gb <= 0 and set(mode.values or ()) & {"swap", "hybrid"}:
        kept = tuple(v for v in mode.values or () if v == "recompute")
        if not kept:
            raise SearchSpaceError(
                f"{where}: preemption_mode swap or hybrid needs swap_space_gb > 0"
            )
        params["preemption_mode"] = replace(mode, values=kept)
    return replace(space, params=params)


def _round_to_step(value: int, step: int, low: int, high: int) -> int:
    if step <= 1:
        return min(max(value, low), high)
    return min(max(round(value / step) * step, low), high)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def describe(space: SearchSpace) -> dict[str, str]:
    """One human-readable line per knob, for the CLI and the report."""
    out = {}
    for name in _SEARCH_ORDER:
        p = space.params[name]
        if name == "num_speculative_tokens" and p.values == (0,):
            continue  # off, as before the knob existed
        if p.is_range:
            scale = "log" if p.log else "linear"
            step = f", step {p.step}" if p.step > 1 else ""
            off = "off or " if p.allow_off else ""
            out[name] = f"{off}{p.low}..{p.high} ({scale}{step})"
        else:
            out[name] = ", ".join(str(v) for v in p.values or ())
    return out
