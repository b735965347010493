"""The server's parts on their own: the engine loop, detokenization, chat prompts, the CLI."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from slotune.cli.app import app
from slotune.engine import Engine, EngineConfig, SamplingParams
from slotune.server.async_engine import AsyncEngine, EngineError
from slotune.server.text import (
    CheckpointTokenizer,
    IncrementalDetokenizer,
    SimTextTokenizer,
    read_chat_template,
    render_chat,
)


def test_detokenizer_streams_exactly_the_full_decode(tiny_dir: Path) -> None:
    from tokenizers import Tokenizer

    tok = CheckpointTokenizer(Tokenizer.from_file(str(tiny_dir / "tokenizer.json")))
    text = "naïve café — 日本語 🎉 done"
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.add([t], final=i == len(ids) - 1) for i, t in enumerate(ids)]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)  # incomplete characters are held back


def test_sim_tokenizer_shows_one_printable_character_per_token() -> None:
    tok = SimTextTokenizer()
    assert tok.encode("héllo") == list("héllo".encode())
    text = tok.decode([100, 255, 31999, 65])
    assert len(text) == 4 and text.isprintable() and text[-1] == "A"


def test_chat_prompt_without_and_with_a_template(tmp_path: Path) -> None:
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert render_chat(messages, None, {}) == "system: S\nuser: U\nassistant:"
    template = (
        "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    config = {"chat_template": template, "bos_token": {"content": "<s>"}}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    found, specials = read_chat_template(tmp_path)
    assert render_chat(messages, found, specials) == "<s><system>S<user>U<assistant>"
    with pytest.raises(ValueError, match="chat template"):
        render_chat(messages, "{{ raise_exception('no system role') }}", {})


class _FlakyEngine:
    """An engine whose step fails once: the loop must fail its requests and carry on."""

    def __init__(self) -> None:
        self.inner = Engine.simulated(EngineConfig(max_model_len=256), gpu="h100")
        self.fail_next = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def step(self) -> Any:
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("boom")
        return self.inner.step()


def test_engine_loop_survives_a_failing_step() -> None:
    async def main() -> None:
        engine = AsyncEngine(_FlakyEngine())  # type: ignore[arg-type]
        engine.start()
        params = SamplingParams(max_tokens=3, ignore_eos=True)
        first = await engine.add("a", [1, 2, 3], params)
        assert isinstance(await first.get(), EngineError)
        second = await engine.add("b", [1, 2, 3], params)
        outs = [await second.get() for _ in range(3)]
        assert [o.finished for o in outs] == [False, False, True]
        with pytest.raises(ValueError, match="max_model_len"):
            await engine.add("c", [1] * 300, params)
        assert engine.running and engine.num_step_errors == 1
        await engine.stop()
        assert not engine.running

    asyncio.run(main())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "either --model"),
        (["--model", "m", "--gpu", "h100"], "either --model"),
        (["--gpu", "h100", "--block-size", "3"], "block_size"),
        (["--gpu", "h100", "--config", "/nonexistent.json"], "--config"),
        (["--gpu", "nonesuch"], "nonesuch"),
        (["--model", "/nonexistent-checkpoint"], "config.json"),
        (["--gpu", "h100", "--max-queue", "-1"], "--max-queue"),
        (["--gpu", "h100", "--drain-timeout", "-2"], "--drain-timeout"),
    ],
)
def test_serve_command_rejects_bad_flags(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["serve", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


class _HangingEngine(_FlakyEngine):
    """An engine whose step never returns (until released): the loop must still stop."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def step(self) -> Any:
        self.release.wait(30)
        return self.inner.step()


def test_engine_loop_stops_while_a_step_hangs() -> None:
    hanging = _HangingEngine()

    async def main() -> None:
        engine = AsyncEngine(hanging)  # type: ignore[arg-type]
        engine.start()
        task = asyncio.create_task(engine.add("a", [1, 2, 3], SamplingParams(max_tokens=2)))
        await asyncio.sleep(0.2)  # the step is running now, and hangs
        await asyncio.wait_for(engine.stop(), 2)
        task.cancel()
        steppers = [t for t in threading.enumerate() if t.name == "slotune-step"]
        assert steppers and all(t.daemon for t in steppers)  # it cannot block the exit

    try:
        asyncio.run(main())
    finally:
        hanging.release.set()


def test_health_fails_while_a_step_is_stuck() -> None:
    from slotune.server import simulated_model
    from tests.server.conftest import ServerThread
    from tests.server.helpers import call

    hanging = _HangingEngine()
    served = simulated_model(EngineConfig(max_model_len=256))[1]
    with ServerThread(hanging, served, stuck_step_s=0.2) as server:
        assert call(server, "/health")[0] == 200
        body = {"prompt": "hi", "max_tokens": 2, "stream": True}
        thread = threading.Thread(target=call, args=(server, "/v1/completions", body))
        thread.start()
        # The step starts once the request is in and reports stuck 0.2 s later; poll rather
        # than sleep a fixed time, which a loaded CI machine can outrun.
        deadline = time.monotonic() + 10
        status, data, _ = call(server, "/health")
        while status == 200 and time.monotonic() < deadline:
            time.sleep(0.1)
            status, data, _ = call(server, "/health")
        assert status == 503 and "stuck" in data["status"]
        hanging.release.set()
        thread.join(10)
        assert call(server, "/health")[0] == 200
