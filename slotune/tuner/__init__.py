"""The tuner: search space, objectives, Optuna studies, and export of the recommendation.

``slotune tune`` is the front door; the pieces are usable on their own::

    space = build_space(max_model_len=2048, overrides={"block_size": 16})
    config = space.suggest(trial)                      # inside any Optuna objective
    print(export({"config": config.to_dict(), "model": "llama-3-8b"}, "vllm"))
"""

from slotune.tuner.export import FORMATS, command_line, export
from slotune.tuner.objectives import (
    OBJECTIVES,
    RateLadder,
    RateSearch,
    parse_weights,
    resolve_weights,
    weighted_score,
)
from slotune.tuner.space import SearchSpace, SearchSpaceError, build_space, load_search_file

__all__ = [
    "FORMATS",
    "OBJECTIVES",
    "RateLadder",
    "RateSearch",
    "SearchSpace",
    "SearchSpaceError",
    "build_space",
    "command_line",
    "export",
    "load_search_file",
    "parse_weights",
    "resolve_weights",
    "weighted_score",
]
