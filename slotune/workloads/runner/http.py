"""Driving an OpenAI-compatible HTTP endpoint (slotune's server, vLLM, SGLang, ...).

Streams ``/v1/completions`` or ``/v1/chat/completions`` with SSE, recording the time of
every chunk that carries text. Prompts are sent as text: the trace's text when it has
one, else its token ids decoded with ``tokenizer`` (byte-level by default, which turns
synthetic ids into ASCII). A session's turn sends the history: the parent's prompt and
the server's actual answer, then the turn's own text (chat: as messages). ``max_tokens``
is the trace's output length with ``ignore_eos`` set (honoured by vLLM and SGLang).
Errors and timeouts are recorded per request; the run always continues.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, Literal

from slotune.engine.tokenizer import ByteTokenizer
from slotune.workloads.arrivals import ALL_AT_ONCE, ArrivalSpec
from slotune.workloads.result import RunResult
from slotune.workloads.runner.dispatch import Dispatcher, Release
from slotune.workloads.runner.record import Recorder
from slotune.workloads.tokenizer import Tokenizer, get_tokenizer
from slotune.workloads.trace import Trace

Endpoint = Literal["completions", "chat"]
Progress = Callable[[int, int], None]


class _TextPrompts:
    def __init__(self, texts: list[str]) -> None:
        self._texts = texts

    def prompt(self, index: int, parent_context: str | None) -> str:
        return (parent_context or "") + self._texts[index]

    def context_after(self, prompt: str, output: str) -> str:
        return prompt + output


class _ChatPrompts:
    def __init__(self, texts: list[str]) -> None:
        self._texts = texts

    def prompt(
        self, index: int, parent_context: list[dict[str, str]] | None
    ) -> list[dict[str, str]]:
        return [*(parent_context or []), {"role": "user", "content": self._texts[index]}]

    def context_after(self, prompt: list[dict[str, str]], output: str) -> list[dict[str, str]]:
        return [*prompt, {"role": "assistant", "content": output}]


def endpoint_url(url: str, endpoint: Endpoint) -> str:
    """``http://host:port`` or ``.../v1`` or a full ``.../completions`` URL."""
    base = url.rstrip("/")
    if base.endswith("/completions"):
        return base
    path = "chat/completions" if endpoint == "chat" else "completions"
    return f"{base}/{path}" if base.endswith("/v1") else f"{base}/v1/{path}"


def run_http(
    url: str, trace: Trace, arrivals: ArrivalSpec = ALL_AT_ONCE, **options: Any
) -> RunResult:
    """Replay ``trace`` against an OpenAI-compatible server, in wall time (``options``:
    those of ``run_http_async``)."""
    return asyncio.run(run_http_async(url, trace, arrivals, **options))


async def run_http_async(
    url: str,
    trace: Trace,
    arrivals: ArrivalSpec = ALL_AT_ONCE,
    *,
    model: str,
    endpoint: Endpoint = "completions",
    seed: int = 0,
    tokenizer: str | Tokenizer | None = None,
    timeout_s: float = 600.0,
    extra_body: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    progress: Progress | None = None,
) -> RunResult:
    import aiohttp

    if endpoint not in ("completions", "chat"):
        raise ValueError(f"endpoint must be 'completions' or 'chat' (got {endpoint!r})")
    # synthetic ids are printable bytes: byte-level text keeps their number
    tok = ByteTokenizer() if tokenizer is None else get_tokenizer(tokenizer)
    own = trace.own_prompt_token_ids()
    texts = [
        r.prompt_text if r.prompt_text is not None else tok.decode(own[i])
        for i, r in enumerate(trace.requests)
    ]
    builder: Any = _ChatPrompts(texts) if endpoint == "chat" else _TextPrompts(texts)
    disp: Dispatcher[Any] = Dispatcher(trace, arrivals, builder, seed=seed)
    rec = Recorder(trace)
    target = endpoint_url(url, endpoint)
    loop = asyncio.get_running_loop()
    t0 = loop.time()

    def now() -> float:
        return loop.time() - t0

    client = _Client(target, model, endpoint, rec, now, extra_body or {})
    tasks: set[asyncio.Task[tuple[int, str]]] = set()
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(
        timeout=timeout, headers=headers, connector=aiohttp.TCPConnector(limit=0)
    ) as session:
        while not disp.done():
            for rel in disp.pop_due(now()):
                rec.sent(rel.index, rel.arrival_time, _approx_tokens(rel.prompt, tok))
                tasks.add(asyncio.create_task(client.send(session, rel)))
            nxt = disp.next_time()
            wait = None if nxt is None else max(0.0, nxt - now())
            if not tasks:
                if wait is None:
                    break
                await asyncio.sleep(wait)
                continue
            done, _ = await asyncio.wait(tasks, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                tasks.discard(task)
                i, output = task.result()
                disp.finish(i, rec.finish[i], output)
                if progress is not None:
                    progress(rec.num_done, len(trace))
    return rec.result(now())


def _approx_tokens(prompt: Any, tok: Tokenizer) -> int:
    if isinstance(prompt, str):
        return len(tok.encode(prompt))
    return sum(len(tok.encode(m["content"])) for m in prompt)


class _Client:
    def __init__(
        self,
        url: str,
        model: str,
        endpoint: Endpoint,
        rec: Recorder,
        now: Callable[[], float],
        extra_body: dict[str, Any],
    ) -> None:
        self.url, self.model, self.endpoint = url, model, endpoint
        self.rec, self.now, self.extra = rec, now, extra_body

    def body(self, rel: Release[Any]) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": rel.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
            "temperature": 0.0,
        }
        body["messages" if self.endpoint == "chat" else "prompt"] = rel.prompt
        body.update(self.extra)
        return body

    async def send(self, session: Any, rel: Release[Any]) -> tuple[int, str]:
        """Never raises: an error is recorded on the request and its partial text returned."""
        i = rel.index
        pieces: list[str] = []
        usage: dict[str, Any] = {}
        error: str | None = None
        try:
            async with session.post(self.url, json=self.body(rel)) as resp:
                if resp.status != 200:
                    text = (await resp.text())[:200].replace("\n", " ")
                    error = f"HTTP {resp.status}: {text}"
                else:
                    error = await self._read_stream(resp, i, pieces, usage)
        except asyncio.TimeoutError:
            error = "timeout"
        except Exception as exc:  # a client must survive any transport failure
            error = f"{type(exc).__name__}: {exc}"[:200]
        if error is None and not self.rec.token_times[i]:
            error = "no tokens received"
        details = usage.get("prompt_tokens_details") or {}
        self.rec.done(
            i,
            self.now(),
            error=error,
            output_tokens=usage.get("completion_tokens")
            if error is None
            else len(self.rec.token_times[i]),
            cached_tokens=int(details.get("cached_tokens") or 0),
            prompt_tokens=usage.get("prompt_tokens"),
        )
        return i, "".join(pieces)

    async def _read_stream(
        self, resp: Any, i: int, pieces: list[str], usage: dict[str, Any]
    ) -> str | None:
        async for raw in resp.content:
            line = raw.decode("utf-8", errors="replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return None
            try:
                chunk = json.loads(data)
            except json.JSONDecodeError:
                return f"bad SSE data: {data[:80]!r}"
            if "error" in chunk:
                return f"server error: {json.dumps(chunk['error'])[:160]}"
            if chunk.get("usage"):
                usage.update(chunk["usage"])
            for choice in chunk.get("choices") or []:
                text = (
                    choice.get("text")
                    if self.endpoint == "completions"
                    else (choice.get("delta") or {}).get("content")
                )
                if text:
                    pieces.append(text)
                    self.rec.tokens(i, self.now())
        return None
