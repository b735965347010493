"""Stretches: runs of engine steps worked out in advance and applied at once.

A simulated engine mostly repeats itself: decoding requests take one token per step, a
prompt takes its chunks, a new request is admitted when budget is left, now and then a
request finishes. Nothing in such a step needs the scheduler's general machinery
(swapping, copy-on-write, forks, most lookups that may hit), so
``StretchPlanner`` works out step after step with integer bookkeeping only: what each
step schedules (the numbers an executor's cost model reads), which requests it admits,
which blocks it allocates in which order, which requests fill blocks, which sample and
which finish. ``apply_stretch`` then applies the planned steps: tokens appended in bulk,
admissions, block allocations, prefix commits and frees in exactly the order single
steps make them. The state afterwards (block ids, free-queue order and prefix-cache
contents included) is the one that many rounds of ``schedule`` and
``update_from_output`` leave.

The running decoders, wherever they sit in the running list, are kept as one aggregate,
bucketed by the step of their next allocation, block fill and finish; a request joins it
with the step after its prompt's last chunk. Only the prefilling requests are stepped one
by one, after the decoders: each sees the budget less every decoder's token, which gives
the chunk the scheduler's pass (in running order) gives unless the budget binds it, and a
bound chunk or a spent budget in front of a decoder ends the stretch (a single step would
starve that decoder). A step's allocations, fills and finishes go in running order.

A step is planned only when it is certain to be such a step: every running decoder fits in
the budget, no prompt needs a fork (``n > 1``), every running allocation fits in the free
blocks (frees during the stretch are counted, conservatively when blocks are shared) or
the step surely preempts (below), and the waiting head either stays out without being
tried (no budget left, no seat, or a swapped head whose blocks are not free), or is tried
and surely stays out, or is a new request whose admission is certain: no stop tokens, its
first chunk's blocks are free, and its prefix lookup cannot hit (no prefix cache, or a
hash cache that holds nothing under its first block and no running request that could
commit one), or a recompute-preempted request without stop tokens, fork or logprobs whose
known hit (below) and first chunk surely fit. A head that is tried and stays out is a new
request whose lookup cannot hit and whose first chunk's blocks are not free, or a
recompute-preempted one whose cached blocks its lookup finds: no running request shares
its first block, so the hit only shrinks, as planned allocations hand its free blocks out
in free-queue order, and admitting it would still take more than the free blocks. Its
lookup commits filled blocks, so ``apply_stretch`` commits them at that step
(``PlannedStep.retry``). A radix lookup touches the tree, so it ends a stretch.

Under recompute preemption and the chunked policy, a step whose running allocations do not
all fit preempts as ``Scheduler._make_room`` does, while the free count is exact: in
running order, the first request whose allocation does not fit takes victims from the
tail of the running order (aggregate decoders or not) until it fits or is itself the
victim. ``PlannedStep.preempts`` says after which allocation each victim goes;
``apply_stretch`` preempts it there (its filled blocks committed, its blocks freed to the
free queue's tail, the request at the waiting front), and the step's waiting pass is
skipped. A victim waits at the front with its tokens and its place in the free queue (its
blocks went to the tail, its first block last). Without a prefix cache its readmission
starts from token 0; under a hash cache its lookup finds its own blocks not handed out
since, known when it alone committed under its first block, no lookup replayed that
group and no other request of the plan shares the block; otherwise a step that tries it
must surely leave it out (a hit of free blocks takes no fewer blocks than its first chunk
from token 0), or the stretch ends. A readmission is a new plan request
(``PlannedRequest.next_stay``); its samples are one run over its stays. A tree's lookup
ends the stretch here too. Swap and hybrid preemption end the stretch.

Arrivals during a stretch reach the planner through ``arrive`` after the step they
follow. When a request finishes and the caller asks (it may send requests then), that step
is the last. Stop tokens are the caller's to check: it knows the tokens and may plan a
shorter stretch again.

The planner and the scheduler follow the same rules, one function each in
``slotune.engine.rules``, and make a step's passes through the same
``Scheduler.run_passes`` (the planner hands itself as the ``Passes``), sized by the
scheduler's ``head_budget``, ``running_tokens`` and ``chunk``. The planner refuses
(``refusal``) configurations and prefix caches its tests do not cover, and requests that
ask for logprobs. ``check`` holds the checking mode (``SLOTUNE_CHECK_STRETCHES=1``): a
shadow scheduler replays every stretch step by step and compares.

Modules: ``plan`` (the named types of a plan), ``planner``, ``apply``, ``check``.
"""

from slotune.engine.stretch.apply import StretchResult, apply_stretch
from slotune.engine.stretch.plan import PlannedRequest, PlannedStep, StretchPlan
from slotune.engine.stretch.planner import StretchPlanner, refusal

__all__ = [
    "PlannedRequest",
    "PlannedStep",
    "StretchPlan",
    "StretchPlanner",
    "StretchResult",
    "apply_stretch",
    "refusal",
]
