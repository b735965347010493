"""The wrong-stack experiment of ``tune --verify``, shared by its slow test and
``benchmarks/verify_loop.py``.

``slotune serve --gpu`` (the simulated engine behind the real HTTP server, paced in
wall-clock time) runs the TRUE stack; the study simulates a WRONG one: the true stack with
``host_exposed_us`` (the host work per step the GPU waits for) ten times too small. The
model is a 1B Llama-shaped config, whose decode step on the GPU (about 1.2 ms) is as long
as that host work on the true stack, so the constant nearly doubles the step: about
1.4 ms on the wrong stack, 2.4 ms on the true one. The candidates differ in
``max_num_batched_tokens``. A 32-token budget prefills a 1,000-token prompt in some 32
steps; at 24 requests/s it keeps up on the wrong stack but not on the true one, where its
TTFT grows with the queue (p99 about 0.2 s simulated, 1.0 s measured), while its small
steps give it the best TPOT. The weights (SLO ttft 1.2 s, tpot 2 ms) make that TPOT win on
the wrong stack (by 0.5 %, deterministic) and the queue lose on the server (by 25-55 % in
the runs measured here), so the flip is not pacing noise. Prompts are text, so that the
study and the server count the same tokens.
"""

from __future__ import annotations

import dataclasses
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from slotune.engine.sim.stack import load_stack

TRUE_STACK = "vllm-0.34"
FIELD = "host_exposed_us"
FACTOR = 0.1
BUDGETS = (32, 256)  # the trials; the defaults (2048) are verified too
NUM_REQUESTS = 32
# a stall of this shared machine can lift one run's TPOT p99, and with it the score, by
# half: the mean of three repeats keeps the measured order (two did not, twice in six runs)
VERIFY_REPEATS = 3
PROMPT_WORDS = 400  # random words: about 1,000 tokens of the Llama 3 vocabulary
OUTPUT_TOKENS = 16
RATE = 24.0
SLO = "ttft=1200ms,tpot=2ms"
MODEL_CONFIG = {  # Llama-3.2-1B's shape
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 2048,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 8192,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
    "eos_token_id": 128001,
    "tie_word_embeddings": True,
}


@dataclass(frozen=True)
class Experiment:
    work: Path
    model: Path  # the folder of the model's config.json
    trace: Path
    search: Path
    wrong_stack: Path

    @property
    def true_value(self) -> float:
        return float(getattr(load_stack(TRUE_STACK), FIELD))

    @property
    def wrong_value(self) -> float:
        return float(getattr(load_stack(str(self.wrong_stack)), FIELD))

    def server(self) -> str:
        """``tune --verify``'s command: ``slotune serve`` on the true stack."""
        return (
            f"{sys.executable} -m slotune serve --gpu h100 --sim-model {self.model} "
            f"--stack {TRUE_STACK} {{flags}} --port {{port}}"
        )

    def tune(self, stack: Path | str, out: Path, **options: Any) -> Any:
        """One round: tune on ``stack``, verify the trials and the defaults on the server
        and fit a stack to the measured runs (``TuneResult``)."""
        from slotune.api import tune

        return tune(
            gpu="h100",
            model=str(self.model),
            target="slotune",
            stack=str(stack),
            slo=SLO,
            objective="weighted",
            sampler="grid",
            search=str(self.search),
            trials=len(BUDGETS),
            trace=str(self.trace),
            num_requests=NUM_REQUESTS,
            rate=RATE,
            out=str(out),
            verify=self.server(),
            verify_top=len(BUDGETS),
            verify_repeats=VERIFY_REPEATS,
            report=False,
            **options,
        )


def prompt(i: int, words: int = PROMPT_WORDS) -> str:
    """Request ``i``'s prompt: text, not token ids, so that the study and the server count
    the same tokens (synthetic ids sent as bytes come back as fewer tokens)."""
    rng = random.Random(i)
    letters = "abcdefghijklmnopqrstuvwxyz"
    text = ("".join(rng.choices(letters, k=rng.randint(2, 7))) for _ in range(words))
    return f"request {i}: " + " ".join(text)


def write_trace(path: Path, requests: int, words: int, output_tokens: int) -> Path:
    """A slotune JSONL trace of ``requests`` text prompts of ``words`` random words."""
    rows = [{"slotune_trace": 1, "name": path.stem, "seed": 0}] + [
        {"id": f"r{i}", "prompt": prompt(i, words), "output_len": output_tokens}
        for i in range(requests)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def prepare(work: Path) -> Experiment:
    """Write the experiment's model config, trace, search space and wrong stack in ``work``."""
    work.mkdir(parents=True, exist_ok=True)
    model = work / "llama-1b"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(MODEL_CONFIG))
    trace = write_trace(work / "trace.jsonl", NUM_REQUESTS, PROMPT_WORDS, OUTPUT_TOKENS)
    search = work / "search.yaml"
    fixed = {
        "max_num_seqs": 256,
        "long_prefill_token_threshold": 0,
        "block_size": 16,
        "preemption_mode": "recompute",
        "prefix_caching": "none",
        "policy": "chunked",
        "kv_cache_dtype": "auto",
    }
    search.write_text(yaml.safe_dump({"max_num_batched_tokens": list(BUDGETS), **fixed}))
    true = load_stack(TRUE_STACK)
    wrong = dataclasses.replace(true, name="wrong", **{FIELD: getattr(true, FIELD) * FACTOR})
    wrong_stack = work / "wrong.json"
    wrong_stack.write_text(json.dumps(wrong.to_dict()))
    return Experiment(work, model, trace, search, wrong_stack)


def predicted_scores(result: Any, stack: Path | str) -> dict[str, float]:
    """The study's score of each verified candidate, simulated on ``stack``: how a study
    started from ``stack`` would rank what the server measured."""
    from slotune.engine.config import EngineConfig
    from slotune.tuner.evaluate import Evaluator

    evaluator = Evaluator(dataclasses.replace(result.setup, stack=str(stack)))
    rate = result.best["load"]["rate"]
    return {
        c.label: evaluator.measure(EngineConfig.from_dict(c.config), rate).score
        for c in result.verified.candidates
    }


def label_of(result: Any, budget: int) -> str:
    """The verified candidate with ``max_num_batched_tokens=budget``."""
    (label,) = [
        c.label for c in result.verified.candidates if c.config["max_num_batched_tokens"] == budget
    ]
    return str(label)
