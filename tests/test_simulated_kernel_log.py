"""The simulated node's kernel log, `/proc/stat` and PCIe topology, read as files the way the kernel shows
them: /dev/kmsg's records (kernel Documentation/ABI/testing/dev-kmsg), /proc/stat's btime
(Documentation/filesystems/proc.rst) and the sysfs AER counters (Documentation/ABI/testing/
sysfs-bus-pci-devices-aer). Scenario time stands still unless a test moves it.
"""

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List

import pytest
import yaml

from gpu_monitoring.simulator.clock import SimClock
from gpu_monitoring.simulator.kernel_log import BOOT_UPTIME
from gpu_monitoring.simulator.node import simulated_node
from gpu_monitoring.simulator.scenario import ScenarioError, resolve
from gpu_monitoring.simulator.scenario import load as load_scenario

RECORD = re.compile(r"(\d+),(\d+),(\d+),([^;,]*)[^;]*;(.*)")
FAULTS_RING = 262144
GPU4, GPU4_PORT = "0000:58:00.0", "0000:00:01.6"  # faults: GPU 4 and the root port above it


@dataclass
class Record:
    prio: int
    seq: int
    usec: int
    flags: str
    text: str
    fields: Dict[str, str] = field(default_factory=dict)
    size: int = 0  # bytes of its line and continuation lines


def parse(path: Path) -> List[Record]:
    """The file's records: a line each, then its dictionary's continuation lines (` KEY=value`)."""
    records: List[Record] = []
    for line in path.read_text().splitlines(keepends=True):
        if line.startswith(" "):
            key, _, value = line[1:-1].partition("=")
            records[-1].fields[key] = value
            records[-1].size += len(line)
            continue
        match = RECORD.fullmatch(line[:-1])
        assert match and line.endswith("\n"), line
        prio, seq, usec, flags, text = match.groups()
        records.append(Record(int(prio), int(seq), int(usec), flags, text, size=len(line)))
    return records


def texts(path: Path) -> List[str]:
    return [record.text for record in parse(path)]


@pytest.fixture
def started():
    """started(scenario, start=0) -> (node, options): a node started at scenario time `start`, on a clock
    that moves only when told."""
    nodes = []

    def start(scenario, at=0.0):
        nodes.append(simulated_node(scenario, SimClock(speed=0, start=at)))
        return nodes[-1], nodes[-1].start(serve_kubernetes=False)

    yield start
    for node in nodes:
        node.stop()


def scenario_file(tmp_path, change, name="faults"):
    """A copy of a scenario with `change(raw)` made to it."""
    raw = yaml.safe_load(resolve(name).read_text())
    change(raw)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def read(path: Path) -> str:
    return Path(path).read_text()


# --- the record format and its time ------------------------------------------------------------


def test_every_record_is_one_of_dev_kmsg(started):
    node, options = started("faults")
    node.nvml.advance(70)
    records = parse(Path(options["kernel_log"]))
    assert [r.seq for r in records] == list(range(len(records)))  # from 0 at boot, no gaps
    assert {r.flags for r in records} == {"-"}
    assert all(r.prio >> 3 in (0, 3) and r.prio & 7 in (3, 4, 5, 6) for r in records)  # kernel or daemon
    assert [r.usec for r in records] == sorted(r.usec for r in records)
    printed = {r.fields.get("DEVICE") for r in records if r.fields}
    assert {r.fields.get("SUBSYSTEM") for r in records if r.fields} == {"pci"}
    # GPU 2's fatal AER error through its port, GPU 4's corrected ones through its, the ConnectX's fault.
    assert printed == {"+pci:0000:00:01.3", "+pci:0000:38:00.0", "+pci:0000:00:01.6", "+pci:0000:58:00.0",
                       "+pci:0000:5c:00.0"}
    assert not any(r.fields for r in records if r.text.startswith("NVRM: "))


def test_the_boot_comes_before_scenario_time_and_each_fault_at_its_own(started):
    node, options = started("faults")
    node.nvml.advance(20)
    records = parse(Path(options["kernel_log"]))
    boot = [r for r in records if r.usec < BOOT_UPTIME * 1e6]
    assert boot[0].text.startswith("Linux version ") and boot[0].usec == 0
    assert any(r.prio == 30 and r.text.startswith("systemd[1]: ") for r in boot)  # facility daemon, info
    (loaded,) = [r for r in boot if r.text.startswith("NVRM: loading ")]
    assert loaded.text == "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.127.05  Tue Oct  8 03:22:07 UTC 2024"
    assert 0 < loaded.usec < 60e6  # seconds after boot
    assert {r.usec for r in records[len(boot):]} == {(BOOT_UPTIME + 20) * 10**6}


def test_proc_stat_has_the_boot_time_and_wall_time_follows_scenario_time(started):
    node, options = started("faults")
    stat = read(Path(options["proc_root"]) / "stat").splitlines()
    assert stat[0].startswith("cpu  ") and stat[1].startswith("cpu0 ")
    assert [line.split()[0] for line in stat[5:]] == ["intr", "ctxt", "btime", "processes", "procs_running",
                                                      "procs_blocked", "softirq"]
    (btime,) = [int(line.split()[1]) for line in stat if line.startswith("btime ")]
    assert btime == node.boot_time
    node.nvml.advance(20)
    assert node.wall_time() == btime + BOOT_UPTIME + 20
    (xid,) = [r for r in parse(Path(options["kernel_log"])) if "Xid (PCI:0000:28:00)" in r.text]
    assert btime + xid.usec / 1e6 == node.wall_time()


def test_a_node_rebuilt_later_writes_the_same_records_with_the_same_seqs(started):
    first, first_options = started("faults")
    first.nvml.advance(70)
    for at in (70, 70.5):  # a restarted sidecar's node, at the instant the first one is at, or a little after
        _, options = started("faults", at)
        assert read(options["kernel_log"]) == read(first_options["kernel_log"])


def test_a_fault_before_the_start_is_kept_though_nvml_tells_no_event_of_it(started):
    node, options = started("faults", 30)
    assert node.nvml.event_sets == {}
    assert "NVRM: Xid (PCI:0000:28:00): 13, pid=1001, name=python3, Graphics SM Warp Exception on (GPC 0, TPC 0, " \
           "SM 0): Out Of Range Address" in texts(Path(options["kernel_log"]))


def test_nothing_is_written_while_no_fault_is_due(started):
    node, options = started("faults")
    path = Path(options["kernel_log"])
    before = (path.stat().st_ino, path.stat().st_mtime_ns, read(path))
    node.nvml.advance(19)
    assert node.kernel_log.advance(19.5) == 0
    assert (path.stat().st_ino, path.stat().st_mtime_ns, read(path)) == before


# --- the ring ----------------------------------------------------------------------------------


def test_new_records_are_appended_to_the_same_file(started):
    node, options = started("faults")
    path = Path(options["kernel_log"])
    node.nvml.advance(20)
    inode, size = path.stat().st_ino, path.stat().st_size
    node.nvml.advance(50)
    assert path.stat().st_ino == inode and path.stat().st_size > size
    assert parse(path)[0].seq == 0


def test_the_ring_drops_the_oldest_records_past_its_size_in_a_new_file(started):
    node, options = started("faults")
    path = Path(options["kernel_log"])
    node.nvml.advance(90)
    inode, last = path.stat().st_ino, parse(path)[-1].seq
    node.nvml.advance(5)  # t=95: GPU 4 named, then 5000 XID 13 on it
    records = parse(path)
    assert path.stat().st_ino != inode  # a reader holding the old file open sees it replaced
    assert records[0].seq > last + 1  # what was there is gone, the boot's records with it
    assert [r.seq for r in records] == list(range(records[0].seq, last + 2 + 5000 + 1))
    assert node.kernel_log.oldest_seq == records[0].seq
    kept = sum(r.size for r in records)
    assert path.stat().st_size == kept <= FAULTS_RING < kept + len("4,0,0,-;" + records[0].text) + 100
    assert records[-1].text == "NVRM: Xid (PCI:0000:58:00): 13, pid=1004, name=python3, Graphics SM Warp " \
                               "Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address"
    node.nvml.advance(15)  # GPU 0's non-fatal AER error and the driver reload: the full ring drops as much
    after = parse(path)
    assert after[-1].text.startswith("NVRM: loading ") and after[0].seq > records[0].seq
    assert [r.seq for r in after] == list(range(after[0].seq, after[-1].seq + 1))
    assert sum(r.size for r in after) <= FAULTS_RING


# --- what each fault writes --------------------------------------------------------------------


def test_an_xid_names_its_gpu_once_then_its_process(started):
    node, options = started("faults")
    node.nvml.advance(20)
    written = texts(Path(options["kernel_log"]))
    at = written.index("NVRM: GPU at PCI:0000:28:00: " + node.nvml.devices[1].spec.uuid)
    assert re.fullmatch(r"NVRM: GPU Board Serial Number: 1\d{12}", written[at + 1])
    assert written[at + 2].startswith("NVRM: Xid (PCI:0000:28:00): 13, pid=1001, name=python3, ")
    # A row remap's XID is no channel's: the driver names no process.
    assert "NVRM: Xid (PCI:0000:68:00): 63, pid='<unknown>', name=<unknown>, Row Remapper: New row " \
           "(0x0000000000c7a3e0) Pending for remapping, reset gpu to activate." in written
    node.nvml.advance(74)
    before = node.kernel_log.next_seq
    node.nvml.advance(1)  # the storm names GPU 4 once: 2 records, then its 5000 XIDs
    assert node.kernel_log.next_seq - before == 2 + 5000


def test_a_gpu_off_the_bus_gets_the_drivers_message_instead_of_its_xid(started):
    node, options = started("faults")
    node.nvml.advance(20)
    written = texts(Path(options["kernel_log"]))
    at = written.index("NVRM: The NVIDIA GPU 0000:38:00.0")
    assert written[at:at + 3] == ["NVRM: The NVIDIA GPU 0000:38:00.0",
                                  "NVRM: (PCI ID: 10de:2331) installed in this system has",
                                  "NVRM: fallen off the bus and is not responding to commands."]
    assert not any("PCI:0000:38:00" in text for text in written)


def test_corrected_aer_errors_as_aer_c_prints_them(started):
    node, options = started("faults")
    node.nvml.advance(50)
    aer = [r for r in parse(Path(options["kernel_log"]))
           if r.text.startswith((f"pcieport {GPU4_PORT}:", f"nvidia {GPU4}:"))]
    assert len(aer) == 12 * 4
    assert [(r.prio, r.text, r.fields) for r in aer[:4]] == [
        (6, f"pcieport {GPU4_PORT}: AER: Corrected error received: {GPU4}",
         {"SUBSYSTEM": "pci", "DEVICE": f"+pci:{GPU4_PORT}"}),
        (4, f"nvidia {GPU4}: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)",
         {"SUBSYSTEM": "pci", "DEVICE": f"+pci:{GPU4}"}),
        (4, f"nvidia {GPU4}:   device [10de:2331] error status/mask=00000001/0000e000",
         {"SUBSYSTEM": "pci", "DEVICE": f"+pci:{GPU4}"}),
        (4, f"nvidia {GPU4}:    [ 0] RxErr                  (First)", {"SUBSYSTEM": "pci", "DEVICE": f"+pci:{GPU4}"}),
    ]


def test_a_fatal_nic_fault_unloads_mlx5_and_takes_its_port_down(started):
    node, options = started("faults")
    port = Path(options["sysfs_root"]) / "class" / "infiniband" / "mlx5_2" / "ports" / "1"
    node.nvml.advance(64)
    assert (read(port / "state"), read(port / "counters" / "link_downed")) == ("4: ACTIVE\n", "0\n")
    node.nvml.advance(1)
    mlx5 = [(r.prio, r.text, r.fields["DEVICE"]) for r in parse(Path(options["kernel_log"])) if "mlx5_core" in r.text]
    assert mlx5 == [
        (3, "mlx5_core 0000:5c:00.0: poll_health:803:(pid 0): device's health compromised - reached miss count",
         "+pci:0000:5c:00.0"),
        (3, "mlx5_core 0000:5c:00.0: mlx5_fw_fatal_reporter_err_work:725:(pid 1234): Driver is in error state. "
            "Unloading", "+pci:0000:5c:00.0"),
    ]
    for t in (65, 200):
        node.nvml.advance(t - node.nvml.now())
        assert (read(port / "state"), read(port / "counters" / "link_downed")) == ("1: DOWN\n", "1\n")


def test_a_gpu_the_driver_could_not_set_up_is_told_at_boot(started):
    _, options = started("gpu-missing")
    written = texts(Path(options["kernel_log"]))
    loaded = next(i for i, text in enumerate(written) if text.startswith("NVRM: loading "))
    assert written[loaded + 1:] == ["NVRM: GPU 0000:c1:00.0: RmInitAdapter failed! (0x26:0x56:1474)",
                                    "NVRM: GPU 0000:c1:00.0: rm_init_adapter failed, device minor number 3"]


def test_an_sxid_and_a_recovery_action_on_hgx_b200(started):
    node, options = started("hgx-b200")
    node.nvml.advance(50)
    records = parse(Path(options["kernel_log"]))
    assert "NVRM: Xid (PCI:0000:52:00): 154, pid='<unknown>', name=<unknown>, GPU recovery action changed from " \
           "0x0 (None) to 0x4 (Drain and Reset)" in [r.text for r in records]
    head = "nvidia-nvswitch1: SXid (PCI:0000:07:00.0): 20009, "
    # The NVSwitch driver prints through vprintk at KERN_ERR, not dev_printk: no dictionary.
    assert [(r.prio, r.text, r.fields) for r in records[-3:]] == [
        (3, head + "Non-fatal, Link 28 RX Short Error Rate", {}),
        (3, head + "Severity 1 Engine instance 28 Sub-engine instance 00", {}),
        (3, head + "Data {" + ", ".join(["0x00000000"] * 8) + "}", {}),
    ]


def test_the_other_severities_and_a_reload(started, tmp_path):
    def change(raw):
        raw["node"]["pci"] = [{"address": "0000:05:00.0", "kind": "nvswitch", "device_id": 0x22A3},
                              {"address": "0000:06:00.0", "kind": "nvswitch", "device_id": 0x22A3}]
        raw["faults"] = [
            {"at": 5, "kind": "aer", "device": 0, "severity": "nonfatal", "count": 1},
            {"at": 6, "kind": "aer", "device": 0, "severity": "fatal", "count": 2},
            {"at": 7, "kind": "nic_fault", "port": "mlx5_0/1", "severity": "warning"},
            {"at": 8, "kind": "sxid", "switch": "0000:06:00.0", "code": 24007, "fatal": True, "link": 30},
            {"at": 9, "kind": "xid", "device": 0, "xid": 31},
            {"at": 10, "kind": "driver_reload"},
            {"at": 11, "kind": "recovery_action", "device": 0, "action": "gpu_reset"},
        ]

    node, options = started(scenario_file(tmp_path, change))
    node.nvml.advance(11)
    written = texts(Path(options["kernel_log"]))
    for line in (
        "pcieport 0000:00:01.0: AER: Uncorrectable (Non-Fatal) error received: 0000:18:00.0",
        "nvidia 0000:18:00.0: PCIe Bus Error: severity=Uncorrectable (Non-Fatal), type=Transaction Layer, "
        "(Requester ID)",
        "nvidia 0000:18:00.0:   device [10de:2331] error status/mask=00004000/00000000",
        "nvidia 0000:18:00.0:    [14] CmpltTO                (First)",
        "nvidia 0000:18:00.0: PCIe Bus Error: severity=Uncorrectable (Fatal), type=Data Link Layer, (Receiver ID)",
        "nvidia 0000:18:00.0:    [ 4] DLP                    (First)",
        "mlx5_core 0000:1c:00.0: port_module:238:(pid 0): Port module event[error]: module 0, Cable error, "
        "High Temperature",
        "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 24007, Fatal, Link 30 sourcetrack timeout error (First)",
        "NVRM: Xid (PCI:0000:18:00): 31, pid=1000, name=python3, Ch 00000008, intr 00000000. MMU Fault: ENGINE "
        "GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f3c_2a000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    ):
        assert line in written, line
    assert sum("Uncorrectable (Fatal) error received" in text for text in written) == 2
    # The reloaded driver prints its banner and names the GPU again before its next XID.
    assert [t for t in written if t.startswith("NVRM: loading ")][1:] == [written[-4]]
    assert written[-3].startswith("NVRM: GPU at PCI:0000:18:00: GPU-")
    assert written[-1] == "NVRM: Xid (PCI:0000:18:00): 154, pid='<unknown>', name=<unknown>, GPU recovery action " \
                          "changed from 0x0 (None) to 0x1 (GPU Reset Required)"
    port = Path(options["sysfs_root"]) / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "state"
    assert read(port) == "4: ACTIVE\n"  # a cable module's warning leaves the port up


def test_an_xid_on_a_mig_instance_names_the_instance_and_its_process(started, tmp_path):
    def change(raw):
        raw["faults"] = [{"at": 5, "kind": "xid", "device": 0, "xid": 13, "gpu_instance": 3}]

    node, options = started(scenario_file(tmp_path, change, "a100-mig"))
    node.nvml.advance(5)
    bus = node.nvml.devices[0].spec.pci_address[:-2]
    assert texts(Path(options["kernel_log"]))[-1] == (
        f"NVRM: Xid (PCI:{bus} GPU-I:03 GPU-CI:00): 13, pid=3102, name=python3, Graphics SM Warp Exception on "
        "(GPC 0, TPC 0, SM 0): Out Of Range Address")


def test_the_command_line_gives_the_rings_size(started):
    _, options = started("faults")
    assert texts(Path(options["kernel_log"]))[1].endswith(" ro log_buf_len=256K")


# --- the PCIe topology and its AER counters --------------------------------------------------


def aer_totals(directory: Path) -> Dict[str, int]:
    """A function's AER totals by name (TOTAL_ERR_COR ...)."""
    lines = [read(directory / name).splitlines()[-1] for name in ("aer_dev_correctable", "aer_dev_nonfatal",
                                                                  "aer_dev_fatal")]
    return {name: int(value) for name, value in (line.split(" ") for line in lines)}


def test_each_gpu_and_nic_sits_behind_a_root_port(started):
    _, options = started("faults")
    sysfs = Path(options["sysfs_root"])
    devices = sysfs / "bus" / "pci" / "devices"
    for address in [d for d in os.listdir(devices) if read(devices / d / "vendor") != "0x8086\n"]:
        parent = (devices / address).resolve().parent
        port = devices / parent.name
        assert parent.parent == sysfs / "devices" / "pci0000:00", address
        assert (read(port / "vendor"), read(port / "device"), read(port / "class")) == (
            "0x8086\n", "0x352a\n", "0x060400\n")
        assert os.path.basename(os.readlink(port / "driver")) == "pcieport"
        assert parent.name.startswith("0000:00:") and parent.name[:7] != address[:7]


def test_the_aer_counters_grow_with_an_aer_fault(started):
    node, options = started("faults")
    devices = Path(options["sysfs_root"]) / "bus" / "pci" / "devices"
    gpu, port = devices / GPU4, devices / GPU4_PORT
    assert read(gpu / "aer_dev_correctable").splitlines() == [
        "RxErr 0", "BadTLP 0", "BadDLLP 0", "Rollover 0", "Timeout 0", "NonFatalErr 0", "CorrIntErr 0",
        "HeaderOF 0", "TOTAL_ERR_COR 0"]
    assert read(gpu / "aer_dev_fatal").splitlines()[:3] == ["Undefined 0", "DLP 0", "SDES 0"]
    assert read(gpu / "aer_dev_fatal").splitlines()[-2:] == ["PoisonTLPBlocked 0", "TOTAL_ERR_FATAL 0"]
    assert read(gpu / "aer_dev_nonfatal").splitlines()[-1] == "TOTAL_ERR_NONFATAL 0"
    node.nvml.advance(49)
    assert read(port / "aer_rootport_total_err_cor") == "0\n"
    node.nvml.advance(1)
    assert read(gpu / "aer_dev_correctable").splitlines()[0] == "RxErr 12"
    assert read(gpu / "aer_dev_correctable").splitlines()[-1] == "TOTAL_ERR_COR 12"
    # The root port counts what it received; the errors its own link detected stay none.
    assert (read(port / "aer_rootport_total_err_cor"), read(port / "aer_rootport_total_err_fatal")) == ("12\n", "0\n")
    assert read(port / "aer_dev_correctable").splitlines()[-1] == "TOTAL_ERR_COR 0"
    assert aer_totals(devices / "0000:48:00.0")["TOTAL_ERR_COR"] == 0  # GPU 3: none
    assert node.sysfs.update(51) == 4 * 2  # only the ports' data counters move on


def test_an_older_kernel_has_no_aer_counters(started, tmp_path):
    _, options = started(scenario_file(tmp_path, lambda raw: raw["node"].update(aer_counters=False)))
    gpu = Path(options["sysfs_root"]) / "bus" / "pci" / "devices" / GPU4
    assert (gpu / "vendor").exists() and not (gpu / "aer_dev_correctable").exists()


# --- scenarios that cannot be ------------------------------------------------------------------


@pytest.mark.parametrize("change, said", [
    (lambda raw: raw["faults"].append({"at": 5, "kind": "aer", "device": 9, "severity": "corrected"}), "device"),
    (lambda raw: raw["faults"].append({"at": 5, "kind": "aer", "device": 1, "severity": "bad"}), "severity"),
    (lambda raw: raw["faults"].append({"at": 5, "kind": "nic_fault", "port": "mlx5_9/1", "severity": "fatal"}),
     "mlx5_9/1"),
    (lambda raw: raw["faults"].append({"at": 5, "kind": "nic_fault", "port": "mlx5_0/1", "severity": "x"}),
     "severity"),
    (lambda raw: raw["faults"].append({"at": 5, "kind": "sxid", "switch": "0000:05:00.0", "code": 1}), "NVSwitches"),
    (lambda raw: raw["faults"].append({"at": 5, "kind": "xid", "device": 1, "xid": 79, "kernel": "x"}), "fall_off"),
    (lambda raw: raw["faults"].append({"at": 5, "kind": "xid", "xid": 13}), "device"),
    (lambda raw: raw["node"].update(pci=[{"address": "0000:05:00.0", "kind": "nvswitch", "device_id": 0x22A3}]) or
     raw["faults"].append({"at": 5, "kind": "sxid", "switch": "0000:05:00.0", "code": 1, "link": "x"}), "link"),
    (lambda raw: raw["node"].update(pci=[{"address": "0000:00:01.0", "kind": "audio", "device_id": 0x22BA}]),
     "root port"),
    (lambda raw: raw["node"].update(pci=[{"address": "0000:c1:00.0", "kind": "gpu", "driver": "none",
                                          "init_failure": "0x26:0x56:1474"}]), "init_failure"),
    (lambda raw: raw["node"].update(kernel_ring_bytes=100), "kernel_ring_bytes"),
])
def test_a_kernel_fault_that_cannot_be_is_refused(tmp_path, change, said):
    with pytest.raises(ScenarioError, match=said):
        load_scenario(scenario_file(tmp_path, change))
