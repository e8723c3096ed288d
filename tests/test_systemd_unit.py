"""The systemd unit that runs the sidecar outside Kubernetes (deploy/systemd): it serves where the
chart's sidecar does, runs hardened without hiding the GPUs, and its README installs what it runs."""

import argparse
import posixpath
import shlex
from pathlib import Path
from typing import Dict, List

from gpu_monitoring.sidecar import command

from .deploy_support import DEPLOY, PROC_READS, SYSFS_READS, chart_socket_path, options

UNIT = DEPLOY / "systemd" / "gpu-monitoring-sidecar.service"


def systemd_unit(path: Path) -> Dict[str, Dict[str, List[str]]]:
    sections: Dict[str, Dict[str, List[str]]] = {}
    current = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"{line!r} is outside any section"
        key, sep, value = line.partition("=")
        assert sep, f"{line!r} is not KEY=VALUE"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def test_systemd_unit():
    unit = systemd_unit(UNIT)
    service = {key: values[-1] for key, values in unit["Service"].items()}

    argv = shlex.split(service["ExecStart"])
    assert argv[:2] == ["/opt/gpu-monitoring/bin/gpu-monitoring", "sidecar"]
    args = options(argv)
    assert args["--socket"] == chart_socket_path()
    assert args["--socket"] == "/var/run/gpu-monitoring/sidecar.sock"
    # The socket lives in the RuntimeDirectory (/run = /var/run), the journal in the StateDirectory.
    assert service["RuntimeDirectory"] == "gpu-monitoring"
    assert posixpath.dirname(args["--socket"]) == "/var/run/" + service["RuntimeDirectory"]
    assert service["StateDirectory"] == "gpu-monitoring"
    assert args["--journal"].startswith("/var/lib/" + service["StateDirectory"] + "/")

    assert service["User"] == "gpu-monitoring"
    assert service["Group"] == "dd-agent"
    assert service["Restart"] == "on-failure"
    assert service["KillSignal"] == "SIGTERM"
    assert service["NoNewPrivileges"] == "yes"
    assert service["ProtectSystem"] == "strict"
    assert service["ProtectHome"] == "yes"
    assert service["PrivateTmp"] == "yes"
    # NVML needs /dev/nvidia*: nothing that hides or filters devices.
    assert service.get("PrivateDevices", "no") in ("no", "false", "0")
    for key in ("DevicePolicy", "DeviceAllow", "ProtectClock"):
        assert key not in service, key
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


def hidden_paths(service: Dict[str, str]) -> List[str]:
    """Paths the unit's sandbox makes unreadable (systemd.exec(5)): InaccessiblePaths= entries,
    TemporaryFileSystem= mount points (an empty tmpfs over them), and with ProcSubset=pid all of
    /proc but the processes' directories (everything this test asks for in /proc is outside them)."""
    hidden = shlex.split(service.get("InaccessiblePaths", ""))
    hidden += [entry.split(":")[0] for entry in shlex.split(service.get("TemporaryFileSystem", ""))]
    if service.get("ProcSubset") == "pid":
        hidden.append("/proc")
    return [path.lstrip("-+") for path in hidden]


def test_the_unit_reads_the_hosts_sysfs_and_proc_and_writes_neither():
    service = {key: values[-1] for key, values in systemd_unit(UNIT)["Service"].items()}
    sysfs_root = options(shlex.split(service["ExecStart"]))["--sysfs-root"]
    assert sysfs_root == "/sys"
    read = [posixpath.join(sysfs_root, *directory) for directory in SYSFS_READS]
    read += [posixpath.join("/proc", *path) for path in PROC_READS]
    for path in read:
        assert not any(path == h or path.startswith(h.rstrip("/") + "/") for h in hidden_paths(service)), path
    # Read-only, not hidden: ProtectKernelTunables= covers /sys and /proc/sys, ProtectControlGroups=
    # /sys/fs/cgroup; ProtectSystem=strict leaves those API file systems to them.
    assert service["ProtectKernelTunables"] == "yes"
    assert service["ProtectControlGroups"] == "yes"
    assert not any(p == "/sys" or p.startswith(("/sys/", "/proc")) for p in service["ReadWritePaths"].split())


def test_the_unit_reads_the_kernel_log_with_cap_syslog_alone():
    service = {key: values[-1] for key, values in systemd_unit(UNIT)["Service"].items()}
    assert options(shlex.split(service["ExecStart"]))["--kernel-log"] == "auto"
    # The unit's user is not root: the capability is ambient, and the only one in the bounding set.
    assert service["User"] != "root"
    assert service["CapabilityBoundingSet"] == "CAP_SYSLOG" == service["AmbientCapabilities"]
    # Nothing that hides /dev/kmsg or forbids reading it: ProtectKernelLogs= removes CAP_SYSLOG and
    # makes /dev/kmsg inaccessible, PrivateDevices= leaves only pseudo-devices, PrivateUsers= makes
    # every capability one of a user namespace, which the kernel's syslog checks do not honour.
    for key in ("ProtectKernelLogs", "PrivateDevices", "PrivateUsers"):
        assert service.get(key, "no") in ("no", "false", "0"), key
    for key in ("DevicePolicy", "DeviceAllow", "SystemCallFilter"):
        assert key not in service, key
    assert not any("/dev/kmsg" == h or "/dev/kmsg".startswith(h.rstrip("/") + "/") for h in hidden_paths(service))
    # A drop-in's flags come after ExecStart's and win: how the README turns the log off.
    assert shlex.split(service["ExecStart"])[-1] == "$GPU_MONITORING_SIDECAR_OPTIONS"


def test_systemd_readme_installs_what_the_unit_runs():
    readme = (DEPLOY / "systemd" / "README.md").read_text()
    unit = systemd_unit(UNIT)
    assert "python3 -m venv /opt/gpu-monitoring" in readme
    # The sidecar's extra, at install and at upgrade; never the Agent's base package.
    installs = [line for line in readme.splitlines() if "/opt/gpu-monitoring/bin/pip install" in line]
    assert len(installs) == 2 and all(line.endswith('.whl)[sidecar]"') for line in installs), installs
    assert "datadog-checks-base" not in readme
    assert "useradd" in readme and unit["Service"]["User"][-1] in readme
    assert f"systemctl enable --now {UNIT.stem}" in readme
    assert "source: sidecar" in readme and f"sidecar_socket: {chart_socket_path()}" in readme
    sysfs_root = options(shlex.split(unit["Service"]["ExecStart"][-1]))["--sysfs-root"]
    assert f"`--sysfs-root {sysfs_root}`" in readme and "`ProtectKernelTunables=`" in readme
    kernel_log = options(shlex.split(unit["Service"]["ExecStart"][-1]))["--kernel-log"]
    assert f"`--kernel-log {kernel_log}`" in readme and "`CapabilityBoundingSet=CAP_SYSLOG`" in readme
    assert "Environment=GPU_MONITORING_SIDECAR_OPTIONS=--kernel-log=none" in readme
    # What the drop-in gives, after ExecStart's flags, is what the sidecar then reads.
    commands = argparse.ArgumentParser().add_subparsers()
    command.add_parsers(commands)
    argv = shlex.split(unit["Service"]["ExecStart"][-1].replace("$GPU_MONITORING_SIDECAR_OPTIONS", "--kernel-log=none"))
    assert commands.choices["sidecar"].parse_args(argv[2:]).kernel_log == "none"
