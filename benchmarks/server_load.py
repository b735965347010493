"""The OpenAI server under load: hundreds of concurrent streaming clients, a third leaving.

    PYTHONPATH=. .venv/bin/python benchmarks/server_load.py [--clients 300] [--target sim tiny]

Starts ``slotune serve`` as its own process on 127.0.0.1 (``--gpu h100``: a simulated
Llama-3-8B; ``tiny``: a tiny checkpoint made by ``init-model``, on this machine's CPU),
then sends ``--clients`` streaming completions at once; every third client closes its
connection after 3 tokens. Reports client-side requests/s, tokens/s, TTFT and ITL
percentiles, and from ``/metrics`` the engine's summed step time (simulated seconds for the
simulated GPU) against the wall time of the load; then checks that nothing is left
running (gauges at zero, every request accounted for) and stops the server with SIGTERM.

``--abuse`` (issue 26): the server runs with ``--api-key`` and ``--max-queue 1000``; after a
plain warm-up load of the same clients, none of which leave, it runs them again while
``tests/server/abuse.py`` sends one abusive request of each kind (sizes, degenerate
sampling, encodings, raw HTTP, slowloris connections), and ``/health`` is polled every
0.1 s. It reports each abuse's answer against the expected one, then checks that every
innocent stream completed, the gauges returned to zero and the server's RSS (from
``/proc``) came back within 10 % of its value before the abusive load.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.server.abuse import AbuseResult, large_bodies, run_abuse
from tests.server.load import run_load

PROMPT = "Benchmark the server with a prompt of a few dozen tokens, the same for all. " * 2


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


API_KEY = "abuse-bench"
MAX_QUEUE = 1000  # above the innocent clients, below a batch of MAX_CHOICES prompts


def _start(
    target: str, port: int, workdir: Path, extra: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[bytes], str]:
    root = Path(__file__).resolve().parents[1]
    cli = [sys.executable, "-c", "from slotune.cli.app import main; main()"]
    if target == "sim":
        flags, model = ["--gpu", "h100", "--max-num-seqs", "256"], "llama-3-8b"
    else:
        subprocess.run([*cli, "init-model", str(workdir / "tiny")], check=True, capture_output=True)
        flags = ["--model", str(workdir / "tiny"), "--device", "cpu", "--max-num-seqs", "256"]
        flags += ["--max-model-len", "1024", "--served-model-name", "tiny"]
        model = "tiny"
    env = os.environ | {"PYTHONPATH": str(root)}
    proc = subprocess.Popen(
        [*cli, "serve", *flags, *extra, "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return proc, model
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"slotune serve ({target}) did not start") from None
            time.sleep(0.2)


def _scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            reason = s.labels.get("finished_reason")
            if "le" not in s.labels:
                out[s.name + (f"[{reason}]" if reason else "")] = s.value
    return out


def _settled(url: str) -> dict[str, float]:
    deadline = time.monotonic() + 30
    while True:
        m = _scrape(url)
        if m["vllm:num_requests_running"] == 0 or time.monotonic() > deadline:
            return m
        time.sleep(0.1)


def bench(target: str, clients: int, max_tokens: int) -> dict[str, Any]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        proc, model = _start(target, port, Path(tmp))
        try:
            before = _scrape(url)
            load = asyncio.run(
                run_load(
                    url, model, clients=clients, max_tokens=max_tokens, prompt=PROMPT, timeout_s=300
                )
            )
            after = _settled(url)
        finally:
            proc.send_signal(signal.SIGTERM)
            start = time.monotonic()
            code = proc.wait(timeout=60)
            exit_s = time.monotonic() - start
    summary: dict[str, Any] = {"target": target, **load.summary()}
    summary["errors"] = len(load.errors)
    summary["engine_s"] = after["slotune:engine_step_seconds_total"] - before.get(
        "slotune:engine_step_seconds_total", 0.0
    )
    summary["left_running"] = after["vllm:num_requests_running"]
    summary["left_waiting"] = after["vllm:num_requests_waiting"]
    summary["kv_usage_after"] = after["vllm:kv_cache_usage_perc"]
    summary["aborted"] = after.get("vllm:request_success_total[abort]", 0.0)
    summary["sigterm_exit"] = f"{code} in {exit_s:.1f}s"
    return summary


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _idle(url: str) -> dict[str, float]:
    """``/metrics`` once the gauges are back at zero (or after 60 s)."""
    deadline = time.monotonic() + 60
    while True:
        m = _scrape(url)
        busy = m["vllm:num_requests_running"] + m["vllm:num_requests_waiting"]
        if busy == 0 or time.monotonic() > deadline:
            return m
        time.sleep(0.1)


async def _poll_health(url: str, stop: asyncio.Event) -> list[float]:
    """Seconds each ``/health`` took while ``stop`` is unset (60 s if it did not answer)."""
    import aiohttp

    times = []
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            start = time.perf_counter()
            try:
                async with session.get(url + "/health", timeout=aiohttp.ClientTimeout(60)) as r:
                    await r.read()
                times.append(time.perf_counter() - start)
            except (aiohttp.ClientError, asyncio.TimeoutError):
                times.append(60.0)
            await asyncio.sleep(0.1)
    return times


async def _abusive_load(
    url: str, port: int, model: str, clients: int, max_tokens: int, abuse: bool
) -> tuple[Any, list[AbuseResult], list[float]]:
    """The innocent clients (with the abuses if ``abuse``), ``/health`` polled meanwhile."""
    stop = asyncio.Event()
    health = asyncio.create_task(_poll_health(url, stop))
    auth = {"Authorization": f"Bearer {API_KEY}"}
    no_abuse: Any = asyncio.sleep(0, [])
    load, abuses = await asyncio.gather(
        run_load(
            url,
            model,
            clients=clients,
            max_tokens=max_tokens,
            prompt=PROMPT,
            leave_every=0,
            timeout_s=300,
            headers=auth,
        ),
        run_abuse(url, port, model, API_KEY, MAX_QUEUE) if abuse else no_abuse,
    )
    stop.set()
    return load, abuses, await health


def bench_abuse(target: str, clients: int, max_tokens: int) -> dict[str, Any]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    extra = ("--api-key", API_KEY, "--max-queue", str(MAX_QUEUE))
    with tempfile.TemporaryDirectory() as tmp:
        proc, model = _start(target, port, Path(tmp), extra)
        try:
            rss_start = _rss_mb(proc.pid)
            warm, _, warm_health = asyncio.run(
                _abusive_load(url, port, model, clients, max_tokens, abuse=False)
            )
            _idle(url)
            large_bodies(model)
            rss_before = _rss_mb(proc.pid)
            start = time.monotonic()
            load, abuse, health = asyncio.run(
                _abusive_load(url, port, model, clients, max_tokens, abuse=True)
            )
            wall = time.monotonic() - start
            after = _idle(url)
            time.sleep(1)
            rss_after = _rss_mb(proc.pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=60)
    for a in abuse:
        mark = "ok" if a.ok else "UNEXPECTED"
        print(
            f"{target}: {a.kind:32} expected {a.expected:16} got {a.got:16} "
            f"{a.seconds:6.2f} s {mark}"
        )
    innocent_ok = load.completed == clients and not load.errors
    return {
        "target": target,
        "innocent completed": f"{load.completed}/{clients}",
        "warm-up completed": f"{warm.completed}/{clients}",
        "errors": len(load.errors),
        "abuses as expected": f"{sum(a.ok for a in abuse)}/{len(abuse)}",
        "wall_s": wall,
        "TTFT p99 ms plain/abused": _pair(warm, load, "ttft_p99_ms"),
        "ITL p99 ms plain/abused": _pair(warm, load, "itl_p99_ms"),
        "/health max ms plain/abused": f"{1e3 * max(warm_health):.0f} / {1e3 * max(health):.0f}",
        "running/waiting after": f"{after['vllm:num_requests_running']:.0f}/"
        f"{after['vllm:num_requests_waiting']:.0f}",
        "rss_mb start/before/after": f"{rss_start:.0f}/{rss_before:.0f}/{rss_after:.0f}",
        "rss_change": f"{100 * (rss_after / rss_before - 1):+.1f} %",
        "verdict": "pass"
        if innocent_ok
        and all(a.ok for a in abuse)
        and after["vllm:num_requests_running"] == after["vllm:num_requests_waiting"] == 0
        and rss_after <= 1.1 * rss_before
        and code == 0
        else "FAIL",
    }


def _pair(plain: Any, abused: Any, key: str) -> str:
    return f"{plain.summary()[key]:.0f} / {abused.summary()[key]:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--target", nargs="+", default=["sim", "tiny"], choices=["sim", "tiny"])
    parser.add_argument("--abuse", action="store_true", help="issue 26's abusive requests too")
    args = parser.parse_args()
    run = bench_abuse if args.abuse else bench
    rows = [run(t, args.clients, args.max_tokens) for t in args.target]
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        cells = [f"{v:.3g}" if isinstance(v, float) else str(v) for v in row.values()]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
