"""Export a measured configuration: the target engine's launch line, a ``vllm serve
--config`` YAML file, or slotune's ``EngineConfig`` JSON.

The flags come from one table (``slotune.targets.flags.FLAGS``). A configuration the
target cannot run exactly as measured is refused with one line saying why
(``ExportRefused``); nothing is substituted.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from slotune.engine.config import EngineConfig
from slotune.engine.hf_config import quantization_method
from slotune.targets import ExportRefused, Launch, Target, get_target, launch_words
from slotune.targets.flags import launch_head
from slotune.targets.registry import LEGACY_TARGET

FORMATS = ("command", "vllm", "sglang", "slotune", "yaml", "json")
"""``command``: the study's target's launch line; ``vllm``/``sglang``/``slotune``: that
engine's (the study's release when it targeted that engine, else the newest supported);
``yaml``: a ``vllm serve --config`` file; ``json``: the ``EngineConfig`` (``slotune bench
--config``)."""


def study_target(best: dict[str, Any]) -> Target:
    """The target a ``best.json`` was tuned for (slotune's engine for files that predate
    targets: their studies searched every knob)."""
    return get_target(str(best.get("target") or LEGACY_TARGET))


def export_target(best: dict[str, Any], fmt: str, target: str | None = None) -> Target:
    if target is not None:
        chosen = get_target(target)
        if fmt in ("vllm", "sglang", "slotune") and chosen.family != fmt:
            raise ValueError(f"--format {fmt} and --target {chosen.name} name different engines")
        return chosen
    tuned = study_target(best)
    if fmt in ("command", "yaml", "json") or tuned.family == fmt:
        return tuned
    return get_target(fmt)


def launch_of(best: dict[str, Any], served_model: str | None = None) -> Launch:
    model = str(best.get("model", "MODEL"))
    gpu = best.get("gpu")
    return Launch(
        served=served_model or hf_model_name(model),
        gpu=None if gpu in (None, "local") else str(gpu),
        model=model,
        tp=int(best.get("tp") or 1),
        ep=int(best.get("ep") or 1),
        quantization=model_quantization(best),
        served_given=served_model is not None,
    )


def command_line(config: EngineConfig, target: Target, launch: Launch) -> str:
    """The ready shell command (raises ``ExportRefused``)."""
    return " ".join(shlex.quote(w) for w in launch_words(config, target, launch))


def engine_args(
    config: EngineConfig,
    engine: str,
    quantization: str | None = None,
    *,
    gpu: str | None = None,
    model: str | None = None,
    tp: int = 1,
    ep: int = 1,
) -> tuple[list[str], list[str]]:
    """The flags of ``config`` on ``engine`` (a target name or family) without the launch
    head, for a server command the user wrote (``tune --verify``: its checkpoint is the
    user's, so no checkpoint kind is asked for); no comments ever (the second item, kept
    for callers of the former API). Raises ``ExportRefused`` like ``export``."""
    target = get_target(engine)
    launch = Launch(
        "MODEL", gpu=gpu, model=model, tp=tp, ep=ep, quantization=quantization, served_given=True
    )
    words = launch_words(config, target, launch)
    return words[len(launch_head(target, launch)) :], []


def vllm_config_file(config: EngineConfig, target: Target, launch: Launch) -> str:
    """A ``vllm serve MODEL --config FILE`` YAML: each flag as ``key: value``, a bare
    ``--flag`` (``--no-flag`` too) as ``flag: true``."""
    import yaml

    if target.family != "vllm":
        raise ExportRefused(
            f"--format yaml writes a `vllm serve --config` file; the target is {target.name} "
            "(use --format command, or json for slotune's EngineConfig)"
        )
    words = launch_words(config, target, launch)
    model_end = 3
    head, flags = words[:model_end], words[model_end:]
    data: dict[str, Any] = {}
    i = 0
    while i < len(flags):
        key = flags[i][2:]
        if i + 1 < len(flags) and not flags[i + 1].startswith("--"):
            value: Any = flags[i + 1]
            data[key] = int(value) if value.lstrip("-").isdigit() else _number(value)
            i += 2
        elif key.startswith("no-"):  # `flag: false` is dropped where only the subcommand
            data[key] = True  # knows --no-flag (vLLM 0.34's serve): `no-flag: true` lands
            i += 1
        else:
            data[key] = True
            i += 1
    comment = f"# {' '.join(head)} --config THIS_FILE   ({target.name})\n"
    return comment + yaml.safe_dump(data, sort_keys=False)


def _number(value: str) -> Any:
    try:
        return float(value)
    except ValueError:
        return value


def export(
    best: dict[str, Any],
    fmt: str = "command",
    *,
    target: str | None = None,
    served_model: str | None = None,
) -> str:
    """Render a ``best.json`` in ``fmt`` (``ValueError``, ``ExportRefused`` with the reason)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")
    config = EngineConfig.from_dict(best["config"])
    if fmt == "json":
        return json.dumps(config.to_dict(), indent=2)
    chosen = export_target(best, fmt, target)
    launch = launch_of(best, served_model)
    if fmt == "yaml":
        return vllm_config_file(config, chosen, launch)
    return command_line(config, chosen, launch)


HF_NAMES = {
    "llama-2-7b": "meta-llama/Llama-2-7b-hf",
    "llama-2-13b": "meta-llama/Llama-2-13b-hf",
    "llama-2-70b": "meta-llama/Llama-2-70b-hf",
    "llama-3-8b": "meta-llama/Meta-Llama-3-8B-Instruct",
    "llama-3-70b": "meta-llama/Meta-Llama-3-70B-Instruct",
    "mistral-7b": "mistralai/Mistral-7B-Instruct-v0.3",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B-Instruct",
    "qwen2.5-32b": "Qwen/Qwen2.5-32B-Instruct",
    "qwen2.5-72b": "Qwen/Qwen2.5-72B-Instruct",
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-Instruct-v0.1",
    "mixtral-8x22b": "mistralai/Mixtral-8x22B-Instruct-v0.1",
    "qwen1.5-moe-a2.7b": "Qwen/Qwen1.5-MoE-A2.7B-Chat",
    "qwen2-moe-57b-a14b": "Qwen/Qwen2-57B-A14B-Instruct",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
    "deepseek-v2-lite": "deepseek-ai/DeepSeek-V2-Lite-Chat",
    "gpt-oss-20b": "openai/gpt-oss-20b",
    "gpt-oss-120b": "openai/gpt-oss-120b",
    "llama-4-scout": "meta-llama/Llama-4-Scout-17B-16E-Instruct",
}
"""Catalogue names -> the Hugging Face repository a production engine would load."""


def hf_model_name(model: str) -> str:
    return HF_NAMES.get(model.lower(), model)


def model_quantization(best: dict[str, Any]) -> str | None:
    """``best["quantization"]`` when set, else the ``quant_method`` of the model's
    ``config.json`` when ``model`` is a local checkpoint folder or file."""
    if best.get("quantization"):
        return str(best["quantization"])
    path = Path(str(best.get("model", "")))
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read the model's config.json ({e})") from None
    return quantization_method(data)
