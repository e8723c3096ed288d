"""What the check reads under the proc root each run: one `stat` per process already known (its
start time keys it, and it gives the current name), the owner's files only for a process not
seen before or a pid the kernel gave to a new process; a process is read once per run however
many GPUs list it. Opens are counted with an audit hook, as the interpreter reports them."""

import sys
from collections import Counter
from pathlib import Path

import pytest

from gpu_monitoring.collectors.owners import ProcessOwners
from gpu_monitoring.simulator.proc_root import build_proc_root

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


def test_a_known_process_costs_one_read_of_stat_a_run(node, opens):
    dgx = node("dgx-h100").run()
    counted = opens(dgx.check.options.proc_root)
    dgx.run(3)
    pids = listed_pids(dgx)
    assert pids
    assert counted == Counter({f"{pid}/stat": 3 for pid in pids})


def test_a_reused_pid_is_read_again(node, opens):
    dgx = node("dgx-h100").run()
    root = Path(dgx.check.options.proc_root)
    # pid 52310 exits and the kernel gives its number to a process of another container.
    stat = root / "52310" / "stat"
    fields = stat.read_text().rpartition(")")
    after = fields[2].split()
    after[19] = str(int(after[19]) + 1000)
    stat.write_text(fields[0] + ")" + " " + " ".join(after) + "\n")
    other = "f" * 64
    (root / "52310" / "cgroup").write_text(f"0::/system.slice/docker-{other}.scope\n")
    counted = opens(root)
    dgx.run()
    assert counted["52310/cgroup"] == 1
    by_pid = {int(tag_dict(s.tags)["pid"]): tag_dict(s.tags) for s in dgx.series("process.memory.used")}
    assert by_pid[52310]["container_id"] == other


def test_a_process_on_many_gpus_is_read_once_a_run(tmp_path, opens):
    root = build_proc_root(tmp_path, [{"pid": 100, "name": "trainer", "container_id": "a" * 64, "runtime": "docker"}])
    owners = ProcessOwners(str(root))
    counted = opens(root)
    for _gpu in range(8):
        assert owners.identify(100).owner.container_id == "a" * 64
    owners.new_run()
    for _gpu in range(8):
        assert owners.identify(100).name == "trainer"
    assert counted == Counter({"100/stat": 2, "100/cgroup": 1})
