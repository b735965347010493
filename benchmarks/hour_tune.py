"""The 50-trial tune on a one-hour Azure-like slice (issue 28's last target: under a
minute here), timed whole and by stage.

    .venv/bin/python benchmarks/hour_tune.py                       # this tree, once
    .venv/bin/python benchmarks/hour_tune.py --repeat 2 --base main  # against main, interleaved

Each tune is a fresh process running ``slotune.tune`` with its report (what ``slotune
tune --gpu a100-80g --model llama-2-7b --trace azure-hour.csv --format azure --slo
ttft=2s,tpot=100ms --num-requests 19500`` runs, without the CLI's start-up), on the
19,500-request trace ``sim_speed.write_azure_csv`` writes. It prints wall and CPU seconds
(the process and its forked children), when the trials ended, and how long the finish
(reruns, what-ifs, writes) and the report took. With ``--base REV`` the same tune runs on
a checkout of another commit (``sim_speed.base_tree``), the trees interleaved, and each
pair's ``trials.csv`` and stored runs must be the same byte for byte, and its what-if
scores equal.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sim_speed import ROOT, base_tree, json_in_tree, write_azure_csv

REQUESTS = 19500
SAME = ("trials.csv", "runs/best/requests.csv", "runs/best/steps.csv", "runs/baseline/steps.csv")
_TUNE = """
import json, resource, sys, time
start = time.perf_counter()
import slotune
marks = {}
def on_event(event):
    if type(event).__name__ in ("StageStarted", "StageDone"):
        marks[type(event).__name__ + ":" + event.stage.name] = time.perf_counter() - start
slotune.tune(gpu="a100-80g", model="llama-2-7b", trace=sys.argv[1], format="azure",
             slo="ttft=2s,tpot=100ms", num_requests=int(sys.argv[3]), out=sys.argv[2],
             on_event=on_event)
end = time.perf_counter() - start
cpu = sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF,
          resource.RUSAGE_CHILDREN) for f in ("ru_utime", "ru_stime"))
print(json.dumps({"wall_s": end, "cpu_s": cpu, "trials_done_s": marks["StageDone:TRIALS"],
                  "finish_s": marks["StageDone:FINISH"] - marks["StageStarted:FINISH"],
                  "report_s": end - marks["StageDone:FINISH"]}))
"""
KEYS = ("wall_s", "cpu_s", "trials_done_s", "finish_s", "report_s")


def tune(tree: Path, trace: Path, out: Path) -> dict[str, float]:
    """One whole tune by the code in ``tree``, in a process of its own."""
    return json_in_tree(tree, _TUNE, str(trace), str(out), str(REQUESTS))


def what_if(out: Path) -> object:
    return json.loads((out / "best.json").read_text()).get("what_if")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--base", help="git revision to compare with, interleaved")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="slotune-hour-"))
    trace = write_azure_csv(work / "azure-hour.csv", REQUESTS)
    trees = {"this": ROOT} | ({"base": base_tree(args.base)} if args.base else {})
    for i in range(args.repeat):
        outs = {}
        for name, tree in trees.items():
            outs[name] = work / f"{name}-{i}"
            row = tune(tree, trace, outs[name])
            print(name, " ".join(f"{k} {row[k]:.2f}" for k in KEYS), flush=True)
        if args.base:
            differ = [f for f in SAME if not filecmp.cmp(outs["this"] / f, outs["base"] / f, False)]
            if what_if(outs["this"]) != what_if(outs["base"]):
                differ.append("best.json's what-if scores")
            print("outputs:", f"differ in {differ}" if differ else "the same", flush=True)


if __name__ == "__main__":
    main()
