"""What the check reads under the proc root each run: nothing for a process already known (one
`stat` call of its directory tells it is the same), `stat` and the owner's files for a process
not seen before or a pid the kernel gave to a new process, `stat` alone when the kernel made the
directory of a known process anew; a process is looked at once per run however many GPUs list
it. Besides, the `stat` of each listed process that ran no kernel over the interval is read once a run
for its state (node.cgroups), which `identified` leaves out. Opens are counted with an audit hook, as
the interpreter reports them."""

import sys
from collections import Counter
from pathlib import Path

import pytest

from gpu_monitoring.node.process_owners import ProcessOwners
from gpu_monitoring.simulator.proc_root import build_proc_root, replace_process

from .conftest import tag_dict

_watched = {"root": None, "opens": Counter()}


def _audit(event, args):
    root = _watched["root"]
    if event == "open" and root and isinstance(args[0], str) and args[0].startswith(root):
        _watched["opens"][args[0][len(root):].lstrip("/")] += 1


sys.addaudithook(_audit)  # an audit hook cannot be removed: it records only while a test watches


@pytest.fixture
def opens():
    """opens(proc_root) starts counting the files opened under it; the Counter is returned."""

    def watch(proc_root):
        _watched["root"], _watched["opens"] = str(proc_root), Counter()
        return _watched["opens"]

    yield watch
    _watched["root"] = None


def listed_pids(dgx):
    return {int(tag_dict(s.tags)["pid"]) for s in dgx.series("process.memory.used")}


def idle_pids(dgx):
    """The listed processes that ran no kernel in the last run (their SM use is `full`'s series)."""
    return {int(tag_dict(s.tags)["pid"]) for s in dgx.series("process.sm_utilization") if s.value == 0}


def identified(counted, dgx, runs=1):
    """What was read to tell who the processes are: the opens less the `stat` of each process that ran no
    kernel, once a run, read for its state (the same processes run after run on the simulated node)."""
    return counted - Counter({f"{pid}/stat": runs for pid in idle_pids(dgx)})


def test_a_known_process_costs_no_read(node, opens):
    dgx = node("dgx-h100", metrics_profile="full").run()
    counted = opens(dgx.check.derived.proc_root)
    dgx.run(3)
    assert listed_pids(dgx)
    assert identified(counted, dgx, 3) == Counter()


def test_only_a_process_that_ran_no_kernel_has_its_state_read(node, opens):
    dgx = node("dgx-h100", metrics_profile="full").run(2)
    counted = opens(dgx.check.derived.proc_root)
    dgx.run()
    sm = {int(tag_dict(s.tags)["pid"]): s.value for s in dgx.series("process.sm_utilization")}
    assert 0 < len([v for v in sm.values() if v > 0]) < len(sm), "some processes busy, some not"
    assert counted == Counter({f"{pid}/stat": 1 for pid, value in sm.items() if value == 0})


def containers(dgx):
    tags = [tag_dict(s.tags) for s in dgx.series("process.memory.used")]
    return {int(t["pid"]): t.get("container_id") for t in tags}


def test_a_reused_pid_is_read_again(node, opens):
    dgx = node("dgx-h100", metrics_profile="full").run()
    root = Path(dgx.check.derived.proc_root)
    # pid 52310 exits and the kernel gives its number to a process of another container.
    other = "f" * 64
    replace_process(root, {"pid": 52310, "name": "python3", "container_id": other, "runtime": "docker",
                           "start_time": 9_000_000})
    counted = opens(root)
    dgx.run()
    assert identified(counted, dgx) == Counter({"52310/stat": 1, "52310/cgroup": 1})
    assert containers(dgx)[52310] == other


def test_a_known_process_whose_directory_is_made_anew_costs_one_read(node, opens):
    dgx = node("dgx-h100", metrics_profile="full").run()
    root = Path(dgx.check.derived.proc_root)
    before = containers(dgx)[52310]
    # The kernel dropped the directory from its cache: the same process (same start time), new
    # directory; its files say otherwise only to show they are not read again.
    replace_process(root, {"pid": 52310, "name": "python3", "container_id": "e" * 64, "runtime": "docker"})
    counted = opens(root)
    dgx.run(2)
    assert identified(counted, dgx, 2) == Counter({"52310/stat": 1})
    assert containers(dgx)[52310] == before


def test_a_process_on_many_gpus_is_read_once(tmp_path, opens):
    root = build_proc_root(tmp_path, [{"pid": 100, "name": "trainer", "container_id": "a" * 64, "runtime": "docker"}])
    owners = ProcessOwners(str(root))
    counted = opens(root)
    for _gpu in range(8):
        assert owners.identify(100).owner.container_id == "a" * 64
    owners.new_run()
    for _gpu in range(8):
        assert owners.identify(100).name == "trainer"
    assert counted == Counter({"100/stat": 1, "100/cgroup": 1})
