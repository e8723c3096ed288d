"""What submission remembers to spare CPU never outlives what it was made from.

A container's tags are asked of the Agent's tagger once a run, however many series carry them, so
the tagger's next answer shows in the next run. A GPU's own tags are made once for each identity
and sharing mode it has, so a GPU that comes to be shared carries its new mode the next run.
"""

import pytest
from datadog_checks.base.stubs import tagger

from gpu_monitoring.snapshot import Allocation

from .attribution_support import container_id, pod_tags, processes
from .conftest import tag_dict

ALICE_GPU, ALICE_PID = 4, 71002  # jupyter-alice's notebook holds GPU 4 alone (dgx-h100)
FREE_GPU = 7


@pytest.fixture
def known_to_the_tagger():
    yield tagger
    tagger.reset()


def alice_series(dgx):
    """The tags of jupyter-alice's GPU, workload and process series in the last run."""
    (gpu,) = [s.tags for s in dgx.series("utilization.gpu") if tag_dict(s.tags)["gpu_index"] == str(ALICE_GPU)]
    (workload,) = [s.tags for s in dgx.series("workload.gpus") if tag_dict(s.tags)["gpu_index"] == str(ALICE_GPU)]
    return {"gpu": gpu, "workload": workload, "process": processes(dgx, "process.memory.used")[ALICE_PID].tags}


def test_the_taggers_new_answer_shows_in_the_next_run(node, known_to_the_tagger):
    dgx = node("dgx-h100")
    alice = f"container_id://{container_id(dgx, 'jupyter-alice')}"
    for team in ("research", "platform"):
        known_to_the_tagger.set_tags({alice: [f"team:{team}", "app:notebook"]})
        dgx.run()
        for kind, tags in alice_series(dgx).items():
            assert tag_dict(tags)["team"] == team, kind
            assert [t for t in tags if t.startswith("team:")] == [f"team:{team}"], kind
    known_to_the_tagger.reset()
    dgx.run()
    for kind, tags in alice_series(dgx).items():
        assert "team" not in tag_dict(tags), kind
        assert pod_tags(tags)["pod_name"] == "jupyter-alice", kind


def sharing_modes(dgx):
    tags = [tag_dict(s.tags) for s in dgx.series("temperature")]
    return {int(t["gpu_index"]): t["gpu_sharing_mode"] for t in tags}


def test_a_gpu_that_comes_to_be_shared_carries_its_new_mode(node):
    dgx = node("dgx-h100", pod_cache_ttl=0).run()  # pod-resources tells the new pods at once
    assert set(sharing_modes(dgx).values()) == {"none"}
    served = dgx.check.simulated_node
    whole = served.allocations()
    replicas = [served.device_id(f"gpu:{FREE_GPU}::{replica}") for replica in (0, 1)]
    served.pod_resources.set_allocations(
        whole + [Allocation("batch", f"job-{r}", "main", "nvidia.com/gpu.shared", d) for r, d in enumerate(replicas)]
    )
    dgx.run()
    assert sharing_modes(dgx) == {**dict.fromkeys(range(8), "none"), FREE_GPU: "time_slicing"}
    served.pod_resources.set_allocations(whole)
    dgx.run()
    assert set(sharing_modes(dgx).values()) == {"none"}
