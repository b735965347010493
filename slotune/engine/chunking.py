"""SLO-aware adaptive chunking: each step's token budget from the TPOT target.

With ``EngineConfig.adaptive_chunk_ms`` > 0 the scheduler does not hand out
``max_num_batched_tokens`` every step: it fills the step only up to the decode deadline of
the running requests. A step that carries ``d`` decodes reading ``context`` KV tokens
together takes ``d`` tokens for them and at most ``p`` more for prefill chunks, the largest
``p`` whose step the step-time model prices within the target; with nobody decoding there
is no deadline and the step takes the whole ``max_num_batched_tokens`` (the ceiling).

The step-time model (``StepTime``) answers ``(num_decodes, context_sum, prefill_tokens,
prefill_prior) -> seconds``, the prefill priced as one chunk after ``prefill_prior``
computed tokens: those of the first running request still prefilling (running requests
take the budget first), else none (a new prompt). The simulator hands its cost model
(``SimExecutor.step_time``); an executor without one (the real torch engine) gets
``MeasuredStepTime``, a least-squares fit over the steps it has run.
"""

from __future__ import annotations

from collections.abc import Callable

StepTime = Callable[[int, int, int, int], float]
"""``(num_decodes, decode_context_sum, prefill_tokens, prefill_prior) -> seconds``."""


def adaptive_budget(
    target_s: float,
    step_time: StepTime,
    num_decodes: int,
    context_sum: int,
    ceiling: int,
    prior: int = 0,
    near: int | None = None,
) -> int:
    """The step's token budget: ``ceiling`` when nothing decodes, else ``num_decodes`` plus
    the largest prefill share whose step ``step_time`` prices within ``target_s`` (never
    below ``num_decodes``, so every decode keeps its token; never above ``ceiling``).

    ``step_time`` grows with the prefill tokens, so the share is found by steps doubling
    away from a first guess, then halving: from ``near`` (a budget: the last step's, as a
    rule close to this one's), else from a single token. The answer is the same from
    anywhere; a close guess only asks ``step_time`` less often."""
    if num_decodes == 0:
        return ceiling
    floor = min(num_decodes, ceiling)
    top = ceiling - floor  # the largest prefill share

    def fits(share: int) -> bool:  # a share of 0 always does
        return share == 0 or step_time(num_decodes, context_sum, share, prior) <= target_s

    start = min(1 if near is None else max(near - floor, 0), top)
    step = 1
    if fits(start):  # lo fits; hi does not (top + 1: nothing above top was tried)
        lo, hi = start, top + 1
        while lo < top:
            probe = min(lo + step, top)
            if not fits(probe):
                hi = probe
                break
            lo, step = probe, 2 * step
    else:
        lo, hi = 0, start
        while hi - step > 0 and not fits(hi - step):
            hi, step = hi - step, 2 * step
        lo = max(hi - step, 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return floor + lo


class MeasuredStepTime:
    """A step-time model fitted to the steps an engine has run: seconds ≈ a + b · tokens +
    c · decode context, by least squares over every step seen (normal equations of running
    sums, so a step costs a few additions). Until it has seen steps of two sizes it prices
    every step at 0 (every step takes the ceiling)."""

    def __init__(self) -> None:
        self._sums = [0.0] * 9  # n, t, c, tt, tc, cc, y, ty, cy
        self._coef: tuple[float, float, float] | None = None

    def observe(self, num_tokens: int, context_sum: int, seconds: float) -> None:
        s = self._sums
        t, c, y = float(num_tokens), float(context_sum), float(seconds)
        s[0] += 1
        s[1] += t
        s[2] += c
        s[3] += t * t
        s[4] += t * c
        s[5] += c * c
        s[6] += y
        s[7] += t * y
        s[8] += c * y
        self._coef = _solve3(s)

    def __call__(
        self, num_decodes: int, context_sum: int, prefill_tokens: int, prefill_prior: int = 0
    ) -> float:
        if self._coef is None:
            return 0.0
        a, b, c = self._coef
        return a + b * (num_decodes + prefill_tokens) + c * context_sum


def _solve3(s: list[float]) -> tuple[float, float, float] | None:
    """Least squares ``y = a + b·t + c·ctx`` from the running sums, with no coefficient
    below 0 (a step never gets cheaper with more tokens, the budget search relies on it,
    nor costs less than nothing): without the context term when it never varied or its
    slope comes out negative, through the origin when the intercept does, the mean step
    when the token slope does; None while the steps cannot tell."""
    import numpy as np

    n, t, c, tt, tc, cc, y, ty, cy = s
    m = np.array([[n, t, c], [t, tt, tc], [c, tc, cc]])
    if abs(np.linalg.det(m)) > 1e-9 * max(1.0, abs(n * tt * cc)):
        a, b, k = np.linalg.solve(m, np.array([y, ty, cy])).tolist()
        if min(a, b, k) >= 0:
            return a, b, k
    det2 = n * tt - t * t
    if abs(det2) > 1e-9 * max(1.0, abs(n * tt)):
        b = (n * ty - t * y) / det2
        if b < 0:
            return y / n, 0.0, 0.0
        a = (y - b * t) / n
        return (a, b, 0.0) if a >= 0 else (0.0, ty / tt, 0.0)
    return None
