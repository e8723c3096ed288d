"""Reading `/pods` answers pod by pod: a pod whose text an earlier answer had keeps its record, the
cut is checked, and whatever the layout the pods are those the whole answer decodes to."""

import json
import random

import pytest

from gpu_monitoring.kube.pod_list import parse_pod_list
from gpu_monitoring.kube.pod_list_reader import PodListReader
from gpu_monitoring.simulator.kubelet_server import pod_list

PODS = [{"uid": f"u-{i}", "name": f"pod-{i}", "namespace": "ml", "labels": {"app": f"a{i}"},
         "containers": [{"name": "main", "container_id": f"{i:064x}", "env": {"N": str(i)}}]} for i in range(6)]
COMPACT = (",", ":")


def answer(pods, separators=COMPACT, **options) -> bytes:
    return json.dumps(pod_list(pods), separators=separators, **options).encode()


def test_the_same_pods_in_another_order_keep_their_records():
    reader = PodListReader()
    first, _ = reader.read(answer(PODS))
    shuffled = random.Random(1).sample(PODS, len(PODS))
    again, skipped = reader.read(answer(shuffled))
    assert [p.name for p in again] == [p["name"] for p in shuffled] and skipped == []
    by_name = {p.name: p for p in first}
    assert all(p is by_name[p.name] for p in again)


def test_a_changed_pod_is_read_again_and_the_others_are_kept():
    reader = PodListReader()
    first = {p.name: p for p in reader.read(answer(PODS))[0]}
    changed = [dict(PODS[0], phase="Succeeded"), *PODS[1:]]
    again = {p.name: p for p in reader.read(answer(changed))[0]}
    assert again["pod-0"].terminal and again["pod-0"] is not first["pod-0"]
    assert all(again[name] is first[name] for name in first if name != "pod-0")


def test_a_bad_pod_is_skipped_with_its_reason_and_the_others_kept():
    bad = dict(PODS[2], labels={"app": 5})
    pods, skipped = PodListReader().read(answer([*PODS[:2], bad, *PODS[3:]]))
    assert [p.name for p in pods] == ["pod-0", "pod-1", "pod-3", "pod-4", "pod-5"]
    assert skipped == ["kubelet pod ml/pod-2 is skipped: metadata.labels['app'] is an integer, not a string"]


NESTED_METADATA = {"volumes": [{"metadata": {"a": 1}}, {"metadata": {"b": 2}}]}


@pytest.mark.parametrize("body", [
    answer(PODS),
    answer(PODS, separators=None),  # Python's spacing, as the simulated kubelet writes
    answer(PODS, indent=2),
    answer([]),
    answer(PODS[:1]),
    # `items` not last, objects inside a pod that open as pods do, a separator's bytes in a string
    json.dumps({"items": pod_list(PODS)["items"], "kind": "PodList", "x": [{"y": 1}]}).encode(),
    answer(PODS).replace(b'"spec":{', b'"spec":' + json.dumps(NESTED_METADATA)[:-1].encode() + b",", 1),
    answer([dict(PODS[0], labels={"note": '},{"metadata":{'}), *PODS[1:]]),
], ids=["go", "python", "indented", "empty", "one", "items-first", "nested-metadata", "separator-in-a-string"])
def test_pods_are_those_the_whole_answer_holds(body):
    reader = PodListReader()
    for _ in range(2):
        assert reader.read(body)[0] == parse_pod_list(json.loads(body))


@pytest.mark.parametrize("body", [b"<html>", b'{"items":[{"metadata":{"name":"a","uid":"u"}}', b'{"pods":[]}',
                                  b'{"items":[{"metadata":{"name":"a","uid":"u"}},{"metadata":]}'])
def test_an_answer_that_is_no_pod_list_is_a_value_error(body):
    with pytest.raises(ValueError):
        PodListReader().read(body)
