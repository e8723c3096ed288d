"""Why a held GPU sits idle, end to end on the simulated nodes: the scenarios lay out each workload's
cgroup files as the kernel does (simulator.cgroup_tree) and the kubelet lists a finished pod, and the
check names one reason per workload holding a GPU idle or below effective_threshold, sends the
holders' CPU figures, counts zombie memory per GPU and makes a GPU nobody holds WARNING for it.

The expected figures come from the scenario files."""

import pytest

from gpu_monitoring.attribution.idle_reasons import PRESSURE, THROTTLED
from gpu_monitoring.cli.main import main

from .attribution_support import workloads
from .conftest import tag_dict
from .test_demo_cost import scenario

GIB = 1024 ** 3


def pod(raw, name):
    return next(p for p in raw["kubernetes"]["pods"] if p["name"].startswith(name))


def gpu_of(container):
    return int(container["devices"][0].split(":")[1])


def reasons(simulated):
    """{(gpu index, pod or job): idle_reason} of workload.idle series that carry one."""
    found = {}
    for stub in simulated.series("workload.idle"):
        tags = tag_dict(stub.tags)
        if "idle_reason" in tags:
            found[(int(tags["gpu_index"]), tags.get("pod_name") or tags.get("slurm_job_id"))] = tags["idle_reason"]
    return found


@pytest.fixture(scope="module")
def dgx_raw():
    return scenario("dgx-h100")


def test_each_held_gpu_below_the_threshold_says_why(node, dgx_raw):
    simulated = node("dgx-h100")
    simulated.run(2)
    throttled, waiting, empty = (pod(dgx_raw, n) for n in ("jupyter-alice", "triton-resnet", "jupyter-bob"))
    assert throttled["containers"][0]["cgroup"]["throttled_percent"] >= THROTTLED
    assert waiting["containers"][0]["cgroup"]["io_some_avg10"] >= PRESSURE
    expected = {
        (gpu_of(throttled["containers"][0]), throttled["name"]): "cpu_throttled",
        (gpu_of(waiting["containers"][0]), waiting["name"]): "io_wait",
        (gpu_of(empty["containers"][0]), empty["name"]): "no_process",
    }
    assert reasons(simulated) == expected


def test_holders_cpu_figures_are_sent(node, dgx_raw):
    simulated = node("dgx-h100", metrics_profile="full")  # workload.cpu.usage is full's
    simulated.run(2)
    alice = pod(dgx_raw, "jupyter-alice")["containers"][0]
    key = (gpu_of(alice), "jupyter-alice")
    figures = alice["cgroup"]
    assert workloads(simulated, "workload.cpu.throttled")[key] == pytest.approx(figures["throttled_percent"], abs=1)
    assert workloads(simulated, "workload.cpu.usage")[key] == pytest.approx(figures["cpu_cores_used"], abs=0.05)
    # Throttling is counted only under a quota: the pods without one send none.
    assert set(workloads(simulated, "workload.cpu.throttled")) == {key}
    assert len(workloads(simulated, "workload.cpu.usage")) >= 5


def test_a_finished_pods_process_holding_memory_is_a_zombie(node, dgx_raw):
    simulated = node("dgx-h100", metrics_profile="full")  # processes.zombie is full's
    simulated.run(2)
    failed = next(p for p in dgx_raw["kubernetes"]["pods"] if p.get("phase") == "Failed")
    (pid,) = failed["containers"][0]["processes"]
    gpu, memory = next((i, p["memory_mib"]) for i, d in enumerate(dgx_raw["devices"])
                       for p in d.get("processes", []) if p["pid"] == pid)
    # Sent only for the GPU that has any.
    assert simulated.values("processes.zombie") == {gpu: 1}
    assert simulated.values("processes.zombie.memory") == {gpu: memory * 1024 * 1024}
    # A finished pod is no workload: its leftover process holds none of the GPU.
    assert not [s for s in simulated.series("workload.gpus") if tag_dict(s.tags).get("pod_name") == failed["name"]]
    health = simulated.health()[gpu]
    assert health.status == simulated.check.WARNING
    assert f"pid {pid} (pod {failed['namespace']}/{failed['name']} is Failed) holds {memory / 1024:.1f} GiB" in \
        health.message
    assert all(stub.status == simulated.check.OK for i, stub in simulated.health().items() if i != gpu)


def test_a_slurm_job_holding_a_gpu_it_runs_nothing_on(node):
    raw = scenario("hpc-slurm")
    job = next(j for j in raw["slurm"]["jobs"] if not j.get("processes"))
    simulated = node("hpc-slurm")
    simulated.run(2)
    (gpu,) = job["gpus"]
    assert reasons(simulated)[(gpu, str(job["id"]))] == "no_process"
    held = {int(tag_dict(s.tags)["gpu_index"]): s.value for s in simulated.series("workload.gpus")
            if tag_dict(s.tags).get("slurm_job_id") == str(job["id"])}
    assert held == {gpu: 1.0}


def test_the_summary_says_why_per_workload(capsys, dgx_raw):
    assert main(["check", "--simulate", "dgx-h100"]) == 0
    out = " ".join(capsys.readouterr().out.split("=== Why held GPUs idle")[1].split())
    percent = pod(dgx_raw, "jupyter-alice")["containers"][0]["cgroup"]["throttled_percent"]
    assert f"research/jupyter-alice 1 GPU below threshold cpu_throttled: throttled in {percent:.0f} % of CPU periods" \
        in out
    assert "research/jupyter-bob 1 GPU idle no_process" in out
