"""What a simulated node's kernel and drivers print to the kernel's log: at boot, and for each fault the
log tells of. Each message is one record of /dev/kmsg (a message of several lines is several records, as
printk splits it), with its level and, for a PCI driver's dev_printk, the function it names.

Where each text comes from:
- NVIDIA's driver (NVIDIA/open-gpu-kernel-modules): nv_printf prints through vprintk with KERN_CONT and no
  level of its own (kernel-open/nvidia/os-interface.c), so its records have the default message level,
  KERN_WARNING, and no device. XIDs: krcReportXid (src/nvidia/src/kernel/gpu/rc/kernel_rc.c), `NVRM: Xid
  (PCI:%04x:%02x:%02x): %d, pid=%s, name=%s, %s`, with pid `'<unknown>'` and name `<unknown>` where no
  channel names the process; before a GPU's first XID since the driver loaded, _krcLogUuidOnce's `NVRM: GPU
  at PCI:...: <UUID>` and `NVRM: GPU Board Serial Number: ...`. A GPU off the bus: nv.c's three lines.
- PCIe AER (drivers/pci/pcie/aer.c): the root port's aer_print_port_info, pci_info with dev_fmt "AER: ";
  then aer_print_error and __aer_print_error on the function that sent the error, through pci_printk,
  which has no dev_fmt (simulator.pcie_aer has the error each severity stands for).
- ConnectX (drivers/net/ethernet/mellanox/mlx5/core): mlx5_core_err, `%s:%d:(pid %d): ` then the text, in
  health.c (poll_health, mlx5_fw_fatal_reporter_err_work) and events.c (port_module), at KERN_ERR.
- NVSwitch (kernel-open/nvidia/linux_nvswitch.c, src/common/nvswitch): NVSWITCH_PRINT_SXID,
  `nvidia-nvswitch%d: SXid (PCI:%04x:%02x:%02x.%x): %05d, ` then the text, through nvswitch_os_print:
  vprintk at KERN_ERR, not dev_printk, so its records name no device either.
"""

import hashlib
from dataclasses import dataclass
from typing import Dict, List, Optional, Set, Tuple

from gpu_monitoring.simulator import pcie_aer
from gpu_monitoring.simulator.fault_events import RECOVERY_ACTION_XID
from gpu_monitoring.simulator.pcie_aer import KERN_ERR, KERN_INFO, KERN_WARNING
from gpu_monitoring.simulator.scenario import DeviceSpec, Fault, Scenario

KERN_NOTICE = 5
# systemd writes its own lines to /dev/kmsg as a daemon (syslog facility 3), not as the kernel (0).
LOG_DAEMON = 3
# The faults the kernel's log tells of.
PRINTED = ("xid", "recovery_action", "driver_reload", "aer", "nic_fault", "sxid")
# The build line of the driver's banner, as `NVRM: loading` prints it after the version.
DRIVER_BUILT = "Tue Oct  8 03:22:07 UTC 2024"
# What follows an XID's process, by code: texts of the shape the driver prints (NVIDIA's XID catalog names
# each code; the details are an H100's, as nodes have logged them).
XID_DETAILS = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    31: "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f3c_2a000000. "
        "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 2, "
        "subpartition 0.",
    63: "Row Remapper: New row (0x0000000000c7a3e0) Pending for remapping, reset gpu to activate.",
    79: "GPU has fallen off the bus.",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) "
         "(0x20800a4c 0x4).",
}
GENERIC_DETAIL = "Ch 00000010"
# XIDs no channel is in error for: the driver names no process (pid '<unknown>', name <unknown>).
NO_PROCESS_XIDS = {48, 63, 64, 74, 79, 92, RECOVERY_ACTION_XID}
# nvmlDeviceGpuRecoveryAction_t's values and the names XID 154 prints for them (NVIDIA's XID catalog).
RECOVERY_ACTIONS = {"none": (0, "None"), "gpu_reset": (1, "GPU Reset Required"),
                    "node_reboot": (2, "Node Reboot Required"), "drain_p2p": (3, "Drain P2P"),
                    "drain_and_reset": (4, "Drain and Reset")}
# The records of a boot up to the driver's load: (seconds after boot, level, facility, text).
BOOT = (
    (0.0, KERN_NOTICE, 0, "Linux version 6.8.0-48-generic (buildd@lcy02-amd64-010) (x86_64-linux-gnu-gcc-13 "
                          "(Ubuntu 13.2.0-23ubuntu4) 13.2.0, GNU ld (GNU Binutils for Ubuntu) 2.42) #48-Ubuntu SMP "
                          "PREEMPT_DYNAMIC Fri Sep 27 14:04:52 UTC 2024 (Ubuntu 6.8.0-48.48-generic 6.8.12)"),
    (0.0, KERN_NOTICE, 0, "Command line: BOOT_IMAGE=/vmlinuz-6.8.0-48-generic root=UUID=1c4b2f3e-8d6a-4f0e-"
                          "9b7c-2e5d4a3f1b60 ro log_buf_len={log_buf_len}"),
    (3.912447, KERN_INFO, 0, "EXT4-fs (nvme0n1p2): mounted filesystem 1c4b2f3e-8d6a-4f0e-9b7c-2e5d4a3f1b60 ro with "
                             "ordered data mode. Quota mode: none."),
    (4.501873, KERN_INFO, LOG_DAEMON, "systemd[1]: systemd 255.4-1ubuntu8.4 running in system mode"),
    (5.218043, KERN_INFO, LOG_DAEMON, "systemd[1]: Started systemd-journald.service - Journal Service."),
    (5.664120, KERN_INFO, 0, "EXT4-fs (nvme0n1p2): re-mounted 1c4b2f3e-8d6a-4f0e-9b7c-2e5d4a3f1b60 r/w. "
                             "Quota mode: none."),
    (9.804511, KERN_WARNING, 0, "nvidia: loading out-of-tree module taints kernel."),
)
# When the driver prints its banner, and its GPUs' failures, after boot.
DRIVER_LOADED_AT = 9.873925
INIT_FAILED_AT = 11.402688


@dataclass(frozen=True)
class KernelMessage:
    """One record's message: `device` is the PCI function a dev_printk names (SUBSYSTEM=pci, DEVICE=+pci:...)."""

    level: int
    text: str
    device: Optional[str] = None
    facility: int = 0


class Printer:
    """What the node's kernel prints, in the order it prints it: `boot()` once, then `fault()` for each fault
    in the order they fire. It keeps what the driver keeps: which GPUs it has named since it loaded."""

    def __init__(self, scenario: Scenario):
        self.scenario = scenario
        self._named: Set[int] = set()
        self._switches = sorted(f.address for f in scenario.node.pci if f.kind == "nvswitch")
        self._nics = {port.name: port.pci for port in scenario.node.network}

    def boot(self) -> List[Tuple[float, KernelMessage]]:
        """(seconds after boot, message) of the records printed at boot, the driver's load among them."""
        ring = _size(self.scenario.node.kernel_ring_bytes)
        records = [(at, KernelMessage(level, text.format(log_buf_len=ring), facility=facility))
                   for at, level, facility, text in BOOT]
        records.append((DRIVER_LOADED_AT, self._banner()))
        records += [(INIT_FAILED_AT, message) for message in self._init_failures()]
        return records

    def fault(self, fault: Fault) -> List[KernelMessage]:
        """The records a fault prints when it fires; none for a kind the log does not tell of."""
        printers = {"xid": self._xid, "recovery_action": self._recovery_action, "driver_reload": self._reload,
                    "aer": self._aer, "nic_fault": self._nic_fault, "sxid": self._sxid}
        return printers[fault.kind](fault) if fault.kind in printers else []

    # --- NVIDIA's driver ------------------------------------------------------------------------------

    def _banner(self) -> KernelMessage:
        """The driver's banner as it loads (nv.c, nvidia_init_module: `NVRM: loading %s` of its NVRM_ID)."""
        version = self.scenario.driver["version"]
        return _nvrm(f"NVRM: loading NVIDIA UNIX x86_64 Kernel Module  {version}  {DRIVER_BUILT}")

    def _reload(self, _fault: Fault) -> List[KernelMessage]:
        """The reloaded driver's banner and what it failed to set up again; it names each GPU anew."""
        self._named.clear()
        return [self._banner()] + self._init_failures()

    def _init_failures(self) -> List[KernelMessage]:
        """A GPU the driver bound but could not set up: RmInitAdapter's status, then nv.c's line naming the
        device minor the GPU would have had (NV_DEV_PRINTF's `NVRM: GPU %04x:%02x:%02x.%x: ` prefix)."""
        minors = {address: minor for minor, address in enumerate(self._bound_gpus())}
        return [message for f in self.scenario.node.pci if f.init_failure for message in (
            _nvrm(f"NVRM: GPU {f.address}: RmInitAdapter failed! ({f.init_failure})"),
            _nvrm(f"NVRM: GPU {f.address}: rm_init_adapter failed, device minor number {minors[f.address]}"),
        )]

    def _bound_gpus(self) -> List[str]:
        """The GPUs bound to the driver, in the order it numbers their device minors: by bus."""
        extra = [f.address for f in self.scenario.node.pci if f.kind == "gpu" and f.driver == "nvidia"]
        return sorted([d.pci_address for d in self.scenario.devices] + extra)

    def _xid(self, fault: Fault) -> List[KernelMessage]:
        device = self.scenario.devices[fault.device]
        if fault.params.get("kernel") == "fall_off":
            return _fallen_off(device)
        code = int(fault.params.get("xid", 0))
        line = self._xid_line(device, code, XID_DETAILS.get(code, GENERIC_DETAIL), fault.params.get("gpu_instance"),
                              fault.params.get("compute_instance", 0))
        return self._name_once(device) + [line] * int(fault.params.get("count", 1))

    def _recovery_action(self, fault: Fault) -> List[KernelMessage]:
        device = self.scenario.devices[fault.device]
        value, name = RECOVERY_ACTIONS.get(fault.params["action"], (0, fault.params["action"]))
        detail = f"GPU recovery action changed from 0x0 (None) to 0x{value:x} ({name})"
        return self._name_once(device) + [self._xid_line(device, RECOVERY_ACTION_XID, detail)]

    def _name_once(self, device: DeviceSpec) -> List[KernelMessage]:
        """The GPU's UUID and board serial, before its first XID since the driver loaded (_krcLogUuidOnce)."""
        if device.index in self._named:
            return []
        self._named.add(device.index)
        return [_nvrm(f"NVRM: GPU at PCI:{_xid_bus(device)}: {device.uuid}"),
                _nvrm(f"NVRM: GPU Board Serial Number: {board_serial(device)}")]

    def _xid_line(self, device: DeviceSpec, code: int, detail: str, gpu_instance: Optional[int] = None,
                  compute_instance: int = 0) -> KernelMessage:
        """krcReportXid's line; on a MIG GPU instance, with the instances the driver attributes it to."""
        where = _xid_bus(device)
        if gpu_instance is not None:
            where += f" GPU-I:{gpu_instance:02d} GPU-CI:{compute_instance:02d}"
        process = _first_process(device, gpu_instance) if code not in NO_PROCESS_XIDS else None
        pid, name = (process["pid"], process.get("name", "python3")) if process else ("'<unknown>'", "<unknown>")
        return _nvrm(f"NVRM: Xid (PCI:{where}): {code}, pid={pid}, name={name}, {detail}")

    # --- the PCIe bus, the NICs and the NVSwitches -----------------------------------------------------

    def _aer(self, fault: Fault) -> List[KernelMessage]:
        """`count` errors as aer.c prints each: the root port's line, then the error's on the GPU."""
        device = self.scenario.devices[fault.device]
        gpu, bridge = device.pci_address, self.scenario.node.bridge_of(device.pci_address)
        error = pcie_aer.ERRORS[fault.params["severity"]]
        status, mask = pcie_aer.status_line(error)
        messages = [
            KernelMessage(KERN_INFO, f"pcieport {bridge}: AER: {error.words} error received: {gpu}", bridge),
            KernelMessage(error.level, f"nvidia {gpu}: PCIe Bus Error: severity={error.words}, type={error.layer}, "
                                       f"({error.agent})", gpu),
            KernelMessage(error.level, f"nvidia {gpu}:   device [10de:{device.pci_device_id >> 16:04x}] error "
                                       f"status/mask={status:08x}/{mask:08x}", gpu),
            # "   [%2d] %-22s%s": the first error (the First Error Pointer's, bit 0 for a corrected one) says so.
            KernelMessage(error.level, f"nvidia {gpu}:    [{error.bit:2d}] {error.name:<22s} (First)", gpu),
        ]
        return messages * int(fault.params.get("count", 1))

    def _nic_fault(self, fault: Fault) -> List[KernelMessage]:
        """mlx5's health poller missing the firmware's heartbeat, then the fatal reporter unloading the
        function; or a cable module's error event."""
        nic = self._nics[fault.params["port"]]
        if fault.params["severity"] == "fatal":
            texts = ["poll_health:803:(pid 0): device's health compromised - reached miss count",
                     "mlx5_fw_fatal_reporter_err_work:725:(pid 1234): Driver is in error state. Unloading"]
        else:
            texts = ["port_module:238:(pid 0): Port module event[error]: module 0, Cable error, High Temperature"]
        return [KernelMessage(KERN_ERR, f"mlx5_core {nic}: {text}", nic) for text in texts]

    def _sxid(self, fault: Fault) -> List[KernelMessage]:
        """An SXid as the NVSwitch driver reports one: its text (the first error of its kind says so), then
        NVSWITCH_REPORT_DATA's severity and engine line and its data line."""
        address = str(fault.params["switch"]).lower()
        code, link = int(fault.params["code"]), int(fault.params.get("link", 0))
        head = f"nvidia-nvswitch{self._switches.index(address)}: SXid (PCI:{address}): {code:05d}, "
        text = (f"Fatal, Link {link:02d} sourcetrack timeout error (First)" if fault.params.get("fatal", True)
                else f"Non-fatal, Link {link:02d} RX Short Error Rate")
        data = ", ".join(["0x00000000"] * 8)
        return [KernelMessage(KERN_ERR, head + rest) for rest in (
            text, f"Severity 1 Engine instance {link:02d} Sub-engine instance 00", f"Data {{{data}}}")]


def board_serial(device: DeviceSpec) -> str:
    """The GPU board's 13-digit serial number (as nvidia-smi's Serial Number shows one): the scenario's
    `serial`, else one its UUID fixes."""
    if device.get("serial"):
        return str(device["serial"])
    digest = int(hashlib.sha256(device.uuid.encode()).hexdigest(), 16)
    return f"1{digest % 10**12:012d}"


def _size(ring_bytes: int) -> str:
    """The ring's size as the kernel's command line gives it (memparse: 1M, 256K, or bytes)."""
    for unit, factor in (("M", 1 << 20), ("K", 1 << 10)):
        if ring_bytes % factor == 0:
            return f"{ring_bytes // factor}{unit}"
    return str(ring_bytes)


def _fallen_off(device: DeviceSpec) -> List[KernelMessage]:
    """nv.c's message for a GPU that answers config reads with all ones: the full address and PCI IDs."""
    pci_id = f"10de:{device.pci_device_id >> 16:04x}"
    return [_nvrm(f"NVRM: The NVIDIA GPU {device.pci_address}"),
            _nvrm(f"NVRM: (PCI ID: {pci_id}) installed in this system has"),
            _nvrm("NVRM: fallen off the bus and is not responding to commands.")]


def _first_process(device: DeviceSpec, gpu_instance: Optional[int] = None) -> Optional[Dict]:
    """The scenario's first process on the GPU, or on its GPU instance `gpu_instance`."""
    instances = [m for m in device.mig if gpu_instance is None or m.gpu_instance_id == gpu_instance]
    processes = (device.processes if gpu_instance is None else []) + [p for m in instances for p in m.processes]
    return processes[0] if processes else None


def _xid_bus(device: DeviceSpec) -> str:
    """The GPU as krcReportXid writes it: domain, bus and device, no function ("0000:9b:00")."""
    return device.pci_address.rpartition(".")[0]


def _nvrm(text: str) -> KernelMessage:
    return KernelMessage(KERN_WARNING, text)
