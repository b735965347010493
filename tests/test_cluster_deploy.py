"""Deployment search, export (launch lines through the tuner's export, the router,
Kubernetes manifests validated against the schemas) and ``slotune deploy``."""

from __future__ import annotations

import importlib
import json
import shlex

import pytest
import yaml
from typer.testing import CliRunner

from slotune.cli.app import app
from slotune.cluster import ClusterSpec, InstanceSpec, RouterSpec
from slotune.cluster.export import launch_lines, manifests, manifests_yaml, router_command
from slotune.cluster.search import DeploySpace, search
from slotune.engine.config import EngineConfig
from slotune.workloads import load_trace, parse_slo
from slotune.workloads.arrivals import ArrivalSpec

tuner_export = importlib.import_module("slotune.tuner.export")

PD = ClusterSpec.disaggregate(
    InstanceSpec(EngineConfig(max_num_batched_tokens=16384, prefix_caching="none"), tp=2),
    3,
    InstanceSpec(EngineConfig(max_num_seqs=512, prefix_caching="none")),
    2,
    router="prefix-aware",
)
REPLICAS = ClusterSpec.replicas(
    4, InstanceSpec(EngineConfig(max_num_seqs=128, prefix_caching="none"), tp=2), "least-kv"
)


def _tuner_line(inst: InstanceSpec, engine: str) -> str:
    best = {"config": inst.config.to_dict(), "gpu": inst.gpu, "model": inst.model, "tp": inst.tp}
    return tuner_export.export(best, engine)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_launch_lines_are_the_tuner_exports_per_kind(engine) -> None:
    lines = launch_lines(REPLICAS, engine)
    assert list(lines) == ["mixed-tp2"]
    assert lines["mixed-tp2"] == _tuner_line(REPLICAS.instances[0], engine) + " --port 8000"
    pd = launch_lines(PD, engine)
    assert list(pd) == ["prefill-tp2", "decode-tp1"]
    for name, inst in zip(pd, (PD.instances[0], PD.instances[-1]), strict=True):
        assert pd[name].startswith(_tuner_line(inst, engine))
        words = shlex.split(pd[name].splitlines()[-1])
        if engine == "vllm":
            connector = json.loads(words[words.index("--kv-transfer-config") + 1])
            assert connector["kv_connector"] == "NixlConnector"
        else:
            assert words[words.index("--disaggregation-mode") + 1] == inst.role


def test_router_command_names_every_instance_and_the_policy() -> None:
    words = shlex.split(router_command(PD))
    assert words.count("--prefill") == 3 and words.count("--decode") == 2
    assert "--pd-disaggregation" in words
    assert words[words.index("--policy") + 1] == "cache_aware"
    assert words[words.index("--cache-threshold") + 1] == str(RouterSpec().cache_threshold)
    rr = router_command(REPLICAS)
    assert rr.startswith("# ") and "power_of_two" in rr  # the nearest policy, said so
    assert shlex.split(rr.splitlines()[-1]).count("--worker-urls") == 1


def test_manifests_per_instance_kind() -> None:
    docs = manifests(PD, "vllm")
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    services = {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
    assert set(deployments) == {"prefill-tp2", "decode-tp1", "router"} == services
    for name, count, gpus in (("prefill-tp2", 3, 2), ("decode-tp1", 2, 1)):
        d = deployments[name]
        assert d["spec"]["replicas"] == count
        pod = d["spec"]["template"]
        assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
        (c,) = pod["spec"]["containers"]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == gpus
        assert c["readinessProbe"]["httpGet"]["path"] == "/health"
        assert c["command"] + c["args"] == shlex.split(launch_lines(PD, "vllm")[name])
    router = deployments["router"]["spec"]["template"]["spec"]
    assert "--service-discovery" in router["containers"][0]["args"]


@pytest.mark.parametrize("spec", [PD, REPLICAS], ids=["pd", "replicas"])
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_manifests_validate_against_the_kubernetes_schemas(spec, engine) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    docs = list(yaml.safe_load_all(manifests_yaml(spec, engine)))
    assert len(docs) >= 7
    for doc in docs:
        kv.validate(doc, "1.30", strict=True)
    broken = dict(docs[0], spec=dict(docs[0]["spec"], replicas="three"))
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, "1.30", strict=True)


@pytest.fixture(scope="module")
def small_study():
    trace = load_trace("sharegpt-like").head(40)
    space = DeploySpace(4, tps=(1, 2))
    return search(
        space,
        trace,
        ArrivalSpec(rate=20),
        parse_slo("ttft=300ms,tpot=30ms"),
        trials=8,
        single_trials=3,
        target=0.9,
    )


def test_search_stays_in_the_budget_and_keeps_the_best(small_study) -> None:
    st = small_study
    assert all(s.spec.num_gpus <= 4 for s in st.trials)
    assert len({s.spec for s in st.trials}) == len(st.trials)  # each deployment runs once
    assert st.single is not None and len(st.single.spec.instances) == 1
    assert st.best.value >= max(s.value for s in st.trials)
    assert st.best.value >= st.single.value
    assert st.best.run is not None  # the best's records are kept for the report
    for s in st.trials:
        assert (s.value >= 0) == s.feasible
        assert s.value == (s.per_gpu if s.feasible else s.attainment - 1)


def test_deploy_command_writes_the_deployment(tmp_path) -> None:
    args = ["deploy", "--slo", "ttft=300ms,tpot=30ms", "--rate", "20", "--gpus", "2"]
    args += ["--num-requests", "30", "--trials", "4", "--single-trials", "1", "--tp", "1"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "deployment.json").read_text())
    assert data["best"]["gpus"] <= 2 and len(data["trials"]) == 4
    assert "vllm serve" in (tmp_path / "launch.sh").read_text()
    assert "kind: Deployment" in (tmp_path / "k8s.yaml").read_text()


@pytest.mark.parametrize(
    ("flag", "value"), [("--tp", "x"), ("--modes", "sideways"), ("--link", "pigeon")]
)
def test_deploy_refuses_bad_input_in_one_line(flag, value) -> None:
    args = ["deploy", "--slo", "ttft=300ms", "--rate", "5", flag, value]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "error" in result.output and flag.lstrip("-") in result.output


def test_slo_losses_are_counted_per_answering_instance() -> None:
    from slotune.cluster import run_cluster
    from slotune.cluster.report import serving_instance, slo_losses, slo_losses_by_instance

    trace = load_trace("sharegpt-like").head(80)
    spec = ClusterSpec.disaggregate(InstanceSpec(), 1, InstanceSpec(), 2, link="tcp")
    run = run_cluster(spec, trace, arrivals=ArrivalSpec(rate=40))
    r = run.result.requests
    ttft = (r["first_token_time"] - r["arrival_time"]) * 1e3
    median = float(ttft.median())
    slo = parse_slo(f"ttft={median}ms,tpot=9ms")
    total = slo_losses(run, slo)
    by = slo_losses_by_instance(run, slo)
    assert total["ttft"] == int((ttft > median).sum()) > 0
    assert set(by) <= {1, 2}  # decode instances answer
    for key in total:
        assert sum(v[key] for v in by.values()) == total[key]
    assert set(serving_instance(run)) == {1, 2}


def test_deploy_simulates_what_the_export_engine_runs(tmp_path) -> None:
    """SGLang runs no hash prefix cache and pages of 1 by default: the instances are
    simulated with its defaults, so the exported line is the one searched."""
    args = ["deploy", "--gpus", "1", "--slo", "ttft=300ms,tpot=50ms", "--rate", "5"]
    args += ["--num-requests", "30", "--trials", "2", "--single-trials", "0"]
    result = CliRunner().invoke(app, [*args, "--engine", "sglang", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    launch = (tmp_path / "launch.sh").read_text()
    assert "sglang.launch_server" in launch and "--page-size 1" in launch


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


@pytest.mark.parametrize("model", ["mixtral-8x7b", "qwen3-30b-a3b", "llama-3-8b"])
def test_expert_parallel_sizes_are_what_the_target_says_and_the_experts_divide(model) -> None:
    """vLLM's EP spans the TP group (--enable-expert-parallel: EP = TP), SGLang's
    --ep-size any divisor of TP; a dense model has none; --no-ep turns it off."""
    from slotune.engine.sim.models import get_model

    moe = get_model(model).moe
    for tp in (1, 2, 4, 8):
        fits = [k for k in _divisors(tp) if moe is not None and moe.num_experts % k == 0]
        fits = [1] + [k for k in fits if k > 1]
        vllm = DeploySpace(8, model=model, target="vllm").eps(tp)
        sglang = DeploySpace(8, model=model, target="sglang").eps(tp)
        assert list(vllm) == [k for k in fits if k in (1, tp)]
        assert list(sglang) == fits
        assert DeploySpace(8, model=model, target="sglang", expert_parallel=False).eps(tp) == (1,)
    if moe is None:
        assert DeploySpace(8, model=model, target="sglang").eps(8) == (1,)


def test_a_trial_sets_each_kinds_ep_and_the_export_says_it() -> None:
    import optuna

    from slotune.cluster.search import suggest

    base = EngineConfig(prefix_caching="none")  # both engines run it
    space = DeploySpace(8, model="mixtral-8x7b", base=base, target="vllm", tps=(2, 4))
    colocated = {"mode": "co-located", "tp": 4, "replicas": 2, "ep_tp4": 4, "router": "least-kv"}
    colocated |= {"max_num_batched_tokens": 8192, "max_num_seqs": 128}
    spec = suggest(optuna.trial.FixedTrial(colocated), space)
    assert {i.ep for i in spec.instances} == {4}
    line = launch_lines(spec, "vllm")["mixed-tp4"]
    assert "--enable-expert-parallel" in shlex.split(line)
    pd = {"mode": "disaggregated", "prefill_tp": 2, "decode_tp": 4, "prefill_instances": 2}
    pd |= {"decode_instances": 1, "prefill_ep_tp2": 1, "decode_ep_tp4": 4}
    pd |= {"prefill_max_num_batched_tokens": 4096, "decode_max_num_seqs": 256}
    pd["router"] = "round-robin"
    spec = suggest(optuna.trial.FixedTrial(pd), space)
    assert [i.ep for i in spec.instances] == [1, 1, 4]
    words = shlex.split(launch_lines(spec, "sglang")["decode-tp4"].splitlines()[-1])
    assert words[words.index("--ep-size") + 1] == "4"
    # a dense model asks for no EP (a FixedTrial refuses a parameter it was not given)
    dense = suggest(optuna.trial.FixedTrial(colocated), DeploySpace(8, tps=(2, 4)))
    assert {i.ep for i in dense.instances} == {1}


def test_tune_gpus_is_the_deploy_search(tmp_path) -> None:
    """``tune --gpus N`` runs deploy's search (one implementation): the same options give
    the same deployment.json, and its report."""
    common = ["--slo", "ttft=300ms,tpot=30ms", "--rate", "20", "--gpus", "2", "--tp", "1"]
    common += ["--num-requests", "30", "--trials", "3", "--seed", "1"]
    runner = CliRunner()
    tuned = runner.invoke(app, ["tune", *common, "--out", str(tmp_path / "t")])
    assert tuned.exit_code == 0, tuned.output
    deployed = runner.invoke(app, ["deploy", *common, "--out", str(tmp_path / "d")])
    assert deployed.exit_code == 0, deployed.output
    t, d = (json.loads((tmp_path / k / "deployment.json").read_text()) for k in "td")
    for data in (t, d):
        data.pop("search_seconds")
    assert t["best"] == d["best"] and t["trials"] == d["trials"]
    assert (tmp_path / "t" / "report.html").is_file()


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ([], "--rate"),
        (["--rate", "5", "--verify", "vllm serve M {flags}"], "--verify"),
        (["--rate", "5", "--target", "slotune"], "--target"),
        (["--rate", "5", "--ep", "2"], "--ep"),
    ],
)
def test_tune_gpus_refuses_what_a_deployment_search_does_not_take(extra, named) -> None:
    result = CliRunner().invoke(app, ["tune", "--slo", "ttft=300ms", "--gpus", "4", *extra])
    assert result.exit_code == 2
    assert "error" in result.output and named in result.output


def test_tune_help_names_gpus() -> None:
    result = CliRunner().invoke(app, ["tune", "--help"], env={"COLUMNS": "200"})
    assert "--gpus" in result.output
