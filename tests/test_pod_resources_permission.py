"""A process whose user may not connect to the kubelet's pod-resources socket says so, and names the fix.

The kubelet makes `pod-resources/` (0750) and its socket root's, and connect(2) on a unix socket
needs write permission on the socket file. These tests run as root, which file permissions do not
stop, so the reading side runs in a subprocess as an unprivileged user (65534, `nobody`) against a
real gRPC pod-resources server whose socket is root's, mode 0755, as the kubelet leaves it.

The subprocess keeps one capability, CAP_DAC_READ_SEARCH, only so that it can read the Python
installation under /root (mode 0700): it grants reading files and searching directories, never
writing, so connecting to the socket is still refused.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from datadog_checks.base import AgentCheck
from datadog_checks.base.stubs import aggregator as _aggregator

from gpu_monitoring.check import GpuMonitoringCheck
from gpu_monitoring.simulator.kubelet_server import KubeletServer
from gpu_monitoring.simulator.pod_resources_server import PodResourcesServer

from .sidecar_support import SidecarProcess

UNPRIVILEGED = 65534
SETPRIV = shutil.which("setpriv")
AS_UNPRIVILEGED = [SETPRIV, f"--reuid={UNPRIVILEGED}", f"--regid={UNPRIVILEGED}", "--clear-groups",
                   "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]
KUBELET_CHECK = "gpu_monitoring.kubelet.can_connect"
# What the message must name: the cause, the user, and the fix.
SAYS = ("permission denied", f"uid {UNPRIVILEGED}", "run as uid 0", "default podSecurityContext")

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or SETPRIV is None,
                                reason="needs root and setpriv to run a process as another user")


@pytest.fixture(scope="module")
def node():
    """A directory any user may search, holding a root-owned pod-resources socket (0755) and a
    directory the unprivileged user owns for the sidecar's socket and journal."""
    # pytest's own tmp directories are 0700 root's: nobody else could reach them.
    base = Path(tempfile.mkdtemp(prefix="gpu-monitoring-permission-"))
    base.chmod(0o755)
    (base / "pod-resources").mkdir(mode=0o755)
    (base / "sidecar").mkdir()
    os.chown(base / "sidecar", UNPRIVILEGED, UNPRIVILEGED)
    socket_path = str(base / "pod-resources" / "kubelet.sock")
    with PodResourcesServer(socket_path) as server:
        os.chmod(socket_path, 0o755)
        yield base, server
    shutil.rmtree(base)


def read_as_unprivileged(socket_path: str) -> str:
    """`reason: message` of the PodResourcesError that listing allocations raises as user 65534."""
    code = ("import sys\n"
            "from gpu_monitoring.kube.pod_resources import PodResourcesError, list_allocations\n"
            "try:\n"
            "    list_allocations(sys.argv[1])\n"
            "except PodResourcesError as e:\n"
            "    print(f'{e.reason}: {e}')\n")
    done = subprocess.run([*AS_UNPRIVILEGED, sys.executable, "-c", code, socket_path],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_socket_the_user_cannot_write_is_permission_denied(node):
    base, server = node
    told = read_as_unprivileged(server.socket_path)
    assert told.startswith("permission: ")
    for words in SAYS:
        assert words in told
    assert server.socket_path in told


def test_a_directory_the_user_cannot_search_is_permission_denied_not_missing(node):
    base, server = node
    # The kubelet's own layout: pod-resources/ is 0750 root's.
    os.chmod(base / "pod-resources", 0o750)
    try:
        told = read_as_unprivileged(server.socket_path)
    finally:
        os.chmod(base / "pod-resources", 0o755)
    assert told.startswith("permission: ") and "does not exist" not in told


@pytest.fixture(scope="module")
def unprivileged_sidecar(node):
    """`gpu-monitoring sidecar` as user 65534 on a simulated node without pods, told to read the
    root-owned pod-resources socket."""
    base, server = node
    sidecar = SidecarProcess(base / "sidecar", "legacy-driver", "--pod-resources-socket", server.socket_path)
    sidecar.args = [*AS_UNPRIVILEGED, *sidecar.args]
    sidecar.start()
    yield sidecar
    sidecar.stop()


def test_the_sidecar_says_so_in_its_snapshot_and_its_start_up_line(unprivileged_sidecar):
    allocations = unprivileged_sidecar.client().get("/v1/snapshot")["snapshot"]["allocations"]
    assert allocations["source"] == "error"
    for words in SAYS:
        assert words in allocations["error"]
    (line,) = [line for line in unprivileged_sidecar.log_text().splitlines() if "serving on" in line]
    assert " WARNING " in line
    assert "pod-resources cannot be read: permission denied" in line
    assert all(words in line for words in SAYS)


def test_a_check_reading_that_sidecar_warns_on_kubelet_can_connect(unprivileged_sidecar, tmp_path):
    with KubeletServer(directory=str(tmp_path)) as kubelet:
        kubelet.write_token_file()
        check = GpuMonitoringCheck("gpu_monitoring", {}, [{
            "source": "sidecar", "sidecar_socket": unprivileged_sidecar.socket, "kubernetes": True,
            "kubelet_url": kubelet.url, "kubelet_token_path": kubelet.token_path, "kubelet_ca_path": kubelet.ca_path,
        }])
        _aggregator.reset()
        assert check.run() == ""
        check.cancel()
    (state,) = _aggregator.service_checks(KUBELET_CHECK)
    assert state.status == AgentCheck.WARNING
    assert state.message.startswith("pod-resources: permission denied")
    for words in SAYS:
        assert words in state.message
