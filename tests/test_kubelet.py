"""The kubelet `/pods` client against a real HTTPS kubelet on 127.0.0.1."""

import socket
import time

import pytest

from gpu_monitoring.kube.kubelet import KubeletClient, KubeletError
from gpu_monitoring.net.agent_http import AgentHttp
from gpu_monitoring.simulator.kubelet_server import KubeletServer
from gpu_monitoring.status import Status

WARNING, CRITICAL = Status.WARNING, Status.CRITICAL

TRAINER = {
    "uid": "7d1c9a52-0f0e-4c55-9a51-1f6e1c2b3a4d",
    "name": "trainer-0",
    "namespace": "ml",
    "phase": "Running",
    "containers": [
        {
            "name": "trainer",
            "container_id": "a1b2c3",
            "env": {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50", "EMPTY": "", "NODE": {"fieldRef": {"fieldPath": "x"}}},
            "limits": {"nvidia.com/gpu": "2", "cpu": "4", "memory": "16Gi"},
        },
        {"name": "logger", "container_id": "d4e5f6", "runtime": "cri-o", "limits": {"cpu": "100m"}},
        {"name": "starting", "container_id": None},
    ],
    "init_containers": [{"name": "fetch-model", "container_id": "0a0b0c", "limits": {"nvidia.com/gpu": "2"}}],
}
FINISHED = {"uid": "u-done", "name": "batch-1", "namespace": "jobs", "phase": "Succeeded", "containers": []}
CRASHED = {"uid": "u-failed", "name": "batch-2", "namespace": "jobs", "phase": "Failed", "containers": []}
WAITING = {"uid": "u-pending", "name": "batch-3", "namespace": "jobs", "phase": "Pending", "containers": []}
SHORT_TTL = 0.2


@pytest.fixture
def kubelet(tmp_path):
    with KubeletServer(pods=[TRAINER], token="first-token", directory=str(tmp_path)) as server:
        yield server


def client(server: KubeletServer, **options) -> KubeletClient:
    settings = {"token_path": server.token_path, "ca_path": server.ca_path, "ttl": 0, **options}
    return KubeletClient(server.pods_url, **settings, http=AgentHttp)


def failure(kube: KubeletClient) -> KubeletError:
    with pytest.raises(KubeletError) as raised:
        kube.pods()
    return raised.value


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_pods_are_parsed(kubelet):
    (pod,) = client(kubelet).pods()
    assert (pod.uid, pod.name, pod.namespace, pod.phase) == (TRAINER["uid"], "trainer-0", "ml", "Running")
    trainer, logger, starting = pod.containers
    assert [trainer.container_id, logger.container_id, starting.container_id] == ["a1b2c3", "d4e5f6", None]
    # valueFrom entries are not in the spec; an empty literal value is kept.
    assert trainer.env == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50", "EMPTY": ""}
    assert trainer.gpu_limits == {"nvidia.com/gpu": "2"}
    assert logger.env == {} and logger.gpu_limits == {}


def test_docker_prefix_is_stripped_and_init_containers_are_left_out(kubelet):
    kubelet.set_pods([{**TRAINER, "containers": [{"name": "app", "container_id": "docker://ff00"}]}])
    (pod,) = client(kubelet).pods()
    assert [(c.name, c.container_id) for c in pod.containers] == [("app", "ff00")]


def test_terminal_pods_are_flagged(kubelet):
    kubelet.set_pods([TRAINER, FINISHED, CRASHED, WAITING])
    assert {p.name: p.terminal for p in client(kubelet).pods()} == {
        "trainer-0": False,
        "batch-1": True,
        "batch-2": True,
        "batch-3": False,
    }


def skipped_logged(caplog):
    return [r.getMessage() for r in caplog.records if "is skipped" in r.getMessage()]


def test_a_bad_pod_costs_itself_alone_and_is_told_once_per_change(kubelet, caplog):
    kube = client(kubelet)
    kubelet.set_pods([TRAINER, {**FINISHED, "labels": {"team": 7}}, CRASHED])
    for _ in range(3):
        assert [p.name for p in kube.pods()] == ["trainer-0", "batch-2"]
    assert skipped_logged(caplog) == [
        "kubelet pod jobs/batch-1 is skipped: metadata.labels['team'] is an integer, not a string; "
        "its GPUs are named from pod-resources alone"
    ]
    kubelet.set_pods([TRAINER, {**FINISHED, "phase": ["Succeeded"]}, CRASHED])
    kube.pods()
    kube.pods()
    assert len(skipped_logged(caplog)) == 2 and "status.phase is an array" in skipped_logged(caplog)[1]
    kubelet.set_pods([TRAINER, FINISHED, CRASHED])
    assert [p.name for p in kube.pods()] == ["trainer-0", "batch-1", "batch-2"]
    assert len(skipped_logged(caplog)) == 2


def test_certificate_is_verified_by_default(kubelet):
    error = failure(client(kubelet, ca_path=None))
    assert error.status == CRITICAL
    assert "system CA bundle" in str(error) and "kubelet_ca_path" in str(error)
    assert kubelet.requests == 0, "no HTTP request may pass an unverified handshake"


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_verification_can_be_turned_off(kubelet):
    assert [p.name for p in client(kubelet, ca_path=None, tls_verify=False).pods()] == ["trainer-0"]


def test_missing_ca_file_is_critical(kubelet, tmp_path):
    missing = str(tmp_path / "nowhere" / "ca.crt")
    error = failure(client(kubelet, ca_path=missing))
    assert error.status == CRITICAL and missing in str(error)
    assert kubelet.requests == 0


def test_wrong_token_is_critical(kubelet):
    kubelet.write_token_file("not-the-token")
    kube = client(kubelet)
    error = failure(kube)
    assert error.status == CRITICAL and "401" in str(error) and kubelet.token_path in str(error)
    # The file still holds the refused token after the re-read, so there is nothing to retry with.
    assert kube.requests == kubelet.requests == 1


def test_missing_token_file_is_critical(kubelet, tmp_path):
    missing = str(tmp_path / "no-token")
    error = failure(client(kubelet, token_path=missing))
    assert error.status == CRITICAL and missing in str(error)
    assert kubelet.requests == 0


def test_rotated_token_is_read_again_after_a_401(kubelet):
    kube = client(kubelet)
    kube.pods()
    kubelet.set_token("second-token", write_file=True)
    assert [p.name for p in kube.pods()] == ["trainer-0"]
    assert kube.requests == kubelet.requests == 3


def test_a_second_401_gives_up(kubelet):
    kube = client(kubelet)
    kube.pods()
    kubelet.behaviour = "unauthorized"
    kubelet.write_token_file("second-token")
    assert failure(kube).status == CRITICAL
    assert kubelet.requests == 3, "one request with the old token, one retry with the new, no more"


def test_one_request_per_ttl(kubelet):
    kube = client(kubelet, ttl=SHORT_TTL)
    for _ in range(5):
        assert [p.name for p in kube.pods()] == ["trainer-0"]
    assert kubelet.requests == 1
    kubelet.set_pods([TRAINER, FINISHED])
    time.sleep(SHORT_TTL + 0.05)
    assert [p.name for p in kube.pods()] == ["trainer-0", "batch-1"]
    assert kubelet.requests == 2


def test_one_tls_connection_serves_every_request(kubelet):
    kube = client(kubelet)
    for _ in range(3):
        assert [p.name for p in kube.pods()] == ["trainer-0"]
    assert (kubelet.requests, kubelet.connections) == (3, 1)


def test_the_environments_proxy_ca_and_netrc_are_not_used(kubelet, monkeypatch, tmp_path):
    # A proxy nobody listens on, a CA bundle that does not exist, and a .netrc whose password
    # would replace the bearer token: any of them used would fail the request.
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tmp_path / "missing.pem"))
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login someone password not-the-token\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert [p.name for p in client(kubelet).pods()] == ["trainer-0"]


def test_down_kubelet_is_a_warning_asked_once_per_ttl():
    kube = KubeletClient(f"https://127.0.0.1:{closed_port()}/pods", None, None, ttl=SHORT_TTL, http=AgentHttp)
    first = failure(kube)
    assert first.status == WARNING and "cannot connect" in str(first)
    assert str(failure(kube)) == str(first)
    assert kube.requests == 1
    time.sleep(SHORT_TTL + 0.05)
    failure(kube)
    assert kube.requests == 2


def test_recovery_replaces_the_cached_error(kubelet):
    kubelet.behaviour = "error"
    kube = client(kubelet)
    assert failure(kube).status == WARNING
    kubelet.behaviour = "ok"
    assert [p.name for p in kube.pods()] == ["trainer-0"]


def test_invalid_json_is_critical(kubelet):
    kubelet.behaviour = "garbage"
    error = failure(client(kubelet))
    assert error.status == CRITICAL and "valid pod list" in str(error)


def test_server_error_is_a_warning(kubelet):
    kubelet.behaviour = "error"
    error = failure(client(kubelet))
    assert error.status == WARNING and "HTTP 500" in str(error)


def test_slow_kubelet_is_a_warning(kubelet):
    kubelet.behaviour = "slow"
    started = time.monotonic()
    error = failure(client(kubelet, timeout=0.2))
    assert error.status == WARNING and "no complete answer within 0.2s" in str(error), str(error)
    assert time.monotonic() - started < 0.9, "the client must give up at its timeout, not wait for the answer"
