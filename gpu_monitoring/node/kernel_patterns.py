"""The kernel's messages about the GPUs and the devices around them, recognised one record at a time.

What is read: the text of one kernel record as /dev/kmsg gives it after the `;` (a text log's line once
its prefix is cut off), and kmsg's `DEVICE=` value where the record has one. Where each format comes from:
- the NVIDIA driver (open-gpu-kernel-modules): Xid reports and the GPU UUID line (kernel_rc.c
  krcReportXid/_krcLogUuidOnce), a GPU gone from the bus (osinit.c osHandleGpuLost, osapi.c
  rm_is_supported_device), a GPU the driver could not initialise (osinit.c RmInitAdapter, nv.c
  nv_start_device), the module's banner (nv.c nvidia_init_module); NVSwitch SXids (src/common/nvswitch,
  common_nvswitch.h NVSWITCH_PRINT_SXID);
- ConnectX: drivers/net/ethernet/mellanox/mlx5/core/health.c (poll_health) and events.c (port_module,
  temp_warn, mlx5_pcie_event);
- PCIe AER: drivers/pci/pcie/aer.c (aer_print_port_info, aer_print_source in newer kernels).
A record that is none of these is dropped after one prefix test: other tenants' messages are never kept.
"""

import re
from dataclasses import dataclass
from typing import List, Optional, Set, Tuple

KINDS = ("xid", "gpu_uuid", "init_failed", "sxid", "nic", "aer", "driver_loaded")

# A finding carries the driver's own words; a corrupt or hostile record must not make it large.
MAX_DETAIL = 200


@dataclass(frozen=True)
class KernelFinding:
    """One recognised message. `address` is a PCI function in sysfs form ("0000:9b:00.0"); `code` the Xid
    or SXid; `severity` an AER's, SXid's or ConnectX event's; `pid`/`process_name` the process an Xid
    names; `detail` the driver's words (at most MAX_DETAIL characters); `uuid` a gpu_uuid's; `link` the
    link an NVLink Xid or an SXid names; `implied` an Xid 79 told by "fallen off the bus" alone;
    `reporter` the port that printed an AER."""

    kind: str  # one of KINDS
    address: Optional[str] = None
    code: Optional[int] = None
    severity: Optional[str] = None
    pid: Optional[int] = None
    process_name: Optional[str] = None
    detail: Optional[str] = None
    uuid: Optional[str] = None
    link: Optional[int] = None
    implied: bool = False
    reporter: Optional[str] = None


_NVRM = "NVRM: "
# Every record recognised here starts with one of these, except AER's, which starts with the name of
# whichever driver holds the reporting port and is told by its "AER: " tag.
_PREFIXES = (_NVRM, "nvidia-nvswitch", "mlx5_core ")
_AER_TAG = ": AER: "

_BDF = r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]"
_HEX_BUS_ID = r"([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2})"

# kernel_rc.c: "NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid=%s, name=%s, %s" (" GPU-I:%02u[ GPU-CI:%02u]" inside
# the parenthesis on a MIG GPU; no pid/name part where no process is known, from 570.123.01). The bus
# ID has no function. Drivers before the PCI: tag print "NVRM: Xid (0000:03:00): 14, ..." (NVIDIA XID Errors
# document, vR384).
_XID = re.compile(r"Xid \((?:PCI:)?" + _HEX_BUS_ID + r"(?: GPU-I:\d+(?: GPU-CI:\d+)?)?\): (\d{1,5}),(?: |\Z)(.*)\Z")
# pid='<unknown>' and name=<unknown> where the driver knows no process (captured in leptonai/gpud#46).
_PROCESS = re.compile(r"pid=(?:'<unknown>'|(\d{1,10}))(?:, name=(.*?))?(?:, |,?\Z)")
_UNKNOWN = "<unknown>"
# NVLink Xids name the link as "... XC0 i0 Link 13 (0x..." and "Link -1" where there is none (captured in
# leptonai/gpud#1160, #1174); nverror.h numbers them NVLINK_SAW_ERROR (144) to NVLINK_MSE_ERROR (150).
_NVLINK_XIDS = range(144, 151)
_XID_LINK = re.compile(r"\bLink (\d{1,3})\b")

# kernel_rc.c _krcLogUuidOnce: "NVRM: GPU at PCI:%04x:%02x:%02x: %s"; older drivers "NVRM: GPU at 0000:03:00:".
_UUID = re.compile(
    r"GPU at (?:PCI:)?" + _HEX_BUS_ID + r": (GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\Z")
# NV_DEV_PRINTF (os-interface.h) prefixes "NVRM: GPU %04x:%02x:%02x.%x: ".
_GPU_LINE = re.compile(r"GPU (" + _BDF + r"): (.*)\Z")
# osinit.c osHandleGpuLost, after the Xid 79 report (or instead of it where none is emitted).
_FALLEN = ("GPU has fallen off the bus.", "GPU has fallen off the bus")
_FALLEN_DETAIL = "GPU has fallen off the bus"
_XID_FALLEN_OFF_THE_BUS = 79  # nverror.h ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS

# osapi.c rm_is_supported_device prints one message of three lines, "The NVIDIA GPU %04x:%02x:%02x.%x" /
# "(PCI ID: %04x:%04x) installed in this system has" / "fallen off the bus and is not responding to
# commands."; the same first words begin its "... is not supported by ..." messages.
_FALLEN_START = re.compile(
    r"The NVIDIA GPU (" + _BDF + r")(?: \(PCI ID: [0-9a-f]{4}:[0-9a-f]{4}\))?( installed in this system has)?\Z")
_FALLEN_MIDDLE = re.compile(r"(?:\(PCI ID: [0-9a-f]{4}:[0-9a-f]{4}\) )?installed in this system has\Z")
_FALLEN_END = "fallen off the bus and is not responding to commands."
# One kmsg record can hold all three lines: kmsg escapes the newlines as \x0a, a reader may unescape them.
_RECORD_LINES = re.compile(r"\n|\\x0a")

# osinit.c RmInitAdapter: "RmInitAdapter failed! (0x%x:0x%x:%d)", behind NV_DEV_PRINTF's "GPU <bdf>: " in
# recent drivers (510.47.03 in NVIDIA/cuda-samples#104) and bare in old ones (358.16 and 280.13 in
# Bumblebee-Project/Bumblebee#722 and #111).
_INIT_CODED = re.compile(r"RmInitAdapter failed! \((0x[0-9a-f]{1,8}:0x[0-9a-f]{1,8}:\d{1,6})\)\Z")
# nv.c, right after it: "rm_init_adapter failed, device minor number %d"; older drivers "rm_init_adapter
# failed for device bearing minor number 0" and "rm_init_adapter(0) failed" (Bumblebee#722, #111).
_INIT_CALL = re.compile(
    r"rm_init_adapter(?:\(\d+\))? failed(?:, device minor number \d+| for device bearing minor number \d+)?\Z")
_INIT_CALL_DETAIL = "rm_init_adapter failed"
# kmsg's DEVICE= for a PCI device: "+pci:0000:00:01.0" (kernel Documentation/ABI/testing/dev-kmsg).
_KMSG_PCI_DEVICE = re.compile(r"\+pci:(" + _BDF + r")\Z")

# nv.c: "NVRM: loading %s" with pNVRM_ID "NVIDIA UNIX x86_64 Kernel Module  550.127.05  <date>" or "NVIDIA
# UNIX Open Kernel Module for aarch64  580.95.05  Release Build  (...)  <date>".
_LOADED = re.compile(r"loading NVIDIA UNIX (?:Open Kernel Module for \w+|\w+ Kernel Module) +(\d+(?:\.\d+)+)\b")

# common_nvswitch.h: "nvidia-%s: SXid (PCI:%04x:%02x:%02x.%x): %05d, " then intr_nvswitch.h's "Fatal, Link %02d
# %s" / "Non-fatal, Link %02d %s" (or a non-link text); the same SXid's further records carry "Severity %d
# Engine instance ..." and "Data {...}" (error_nvswitch.c) instead of the Fatal/Non-fatal word.
_SXID = re.compile(r"nvidia-nvswitch\d+: SXid \(PCI:(" + _BDF + r")\): (\d{1,5}), (Fatal|Non-fatal), (.*)\Z")
_SXID_SEVERITY = {"Fatal": "fatal", "Non-fatal": "nonfatal"}
_SXID_LINK = re.compile(r"Link (\d{1,3})\b")

# dev_printk's "mlx5_core <bdf>: ", or "mlx5_core <bdf> <netdev>: " from netdev_printk; mlx5_core_err and
# mlx5_core_warn then add "%s:%d:(pid %d): " (function, line, pid), which kernels before 5.x precede with
# the device's name ("0000:03:00.0:handle_hca_cap:438:(pid 6016): "). The detail leaves that out: it
# differs from kernel to kernel for the same event.
_MLX5 = re.compile(r"mlx5_core (" + _BDF + r")(?: \S+)?: (?:(?:" + _BDF + r":)?\w+:\d+:(?:\(pid \d+\):)? )?(.*)\Z")
_NIC_MESSAGES = (
    # health.c poll_health: the firmware stopped counting, or a fatal sensor tripped; each is followed by
    # print_health_info's dump (assert_var, synd, ...), which says no more about whether it happened.
    ("fatal", re.compile(r"device's health compromised\b|Fatal error \d+ detected\Z")),
    # events.c port_module: the module's error or its removal; temp_warn and mlx5_pcie_event: the adapter
    # too hot, or its slot too weak to power its ports.
    ("warning", re.compile(
        r"Port module event\[error\]: |Port module event: module \d+, Cable (?:unplugged|disabled)\Z"
        r"|High temperature on sensors |Detected insufficient power on the PCIe slot ")),
)

# aer.c aer_print_port_info: "<driver> <port>: AER: [Multiple ]<severity> error received: <source>"; older
# kernels "... error received: id=%04x" (the requester ID, bus << 8 | devfn; hirschmann/nbfc#181), and
# kernels of 2025 "... error message received from <source>" with the severities "Correctable" and
# "Uncorrectable (...)" (minisforum-docs/MS-02-Ultra#10).
_AER = re.compile(
    r"\S+ (" + _BDF + r"): AER: (?:Multiple )?(Correct(?:ed|able)|Uncorrect(?:ed|able) \((?:Non-)?Fatal\)) "
    r"error (?:received:|message received from) (id=[0-9a-f]{4}|" + _BDF + r")\b")


class KernelPatterns:
    """Recognises one message at a time. Stateful only for messages the driver splits over several records."""

    def __init__(self) -> None:
        # The GPU of an "The NVIDIA GPU <bdf>" opening, and whether its "installed in this system has" came.
        self._fallen: Optional[Tuple[str, bool]] = None
        # GPUs whose "RmInitAdapter failed! (code)" still awaits nv.c's "rm_init_adapter failed" after it:
        # the pair is one failure, counted at the line with the code.
        self._coded_init: Set[Optional[str]] = set()

    def match(self, text: str, device: Optional[str] = None) -> List[KernelFinding]:
        if text.startswith(_PREFIXES):
            if text.startswith(_NVRM):
                return self._nvrm(text[len(_NVRM):], device)
            self._fallen = None
            return _sxid(text) if text.startswith("nvidia-nvswitch") else _nic(text)
        self._fallen = None
        return _aer(text) if _AER_TAG in text else []

    def _nvrm(self, rest: str, device: Optional[str]) -> List[KernelFinding]:
        if self._fallen is not None:
            continued = self._fallen_continues(rest)
            if continued is not None:
                return continued
        if rest.startswith("Xid ("):
            return _xid(rest)
        if rest.startswith("GPU "):
            return self._gpu(rest)
        if rest.startswith("The NVIDIA GPU "):
            return self._fallen_starts(rest, device)
        if rest.startswith(("RmInitAdapter failed!", "rm_init_adapter")):
            return self._init_failed(rest, _kmsg_pci_address(device))
        if rest.startswith("loading NVIDIA UNIX "):
            return _driver_loaded(rest)
        return []

    def _gpu(self, rest: str) -> List[KernelFinding]:
        uuid = _UUID.match(rest)
        if uuid:
            return [KernelFinding("gpu_uuid", address=uuid.group(1) + ".0", uuid=uuid.group(2))]
        line = _GPU_LINE.match(rest)
        if not line:
            return []
        address, said = line.groups()
        if said in _FALLEN:
            return [_implied_fallen(address)]
        return self._init_failed(said, address)

    def _init_failed(self, said: str, address: Optional[str]) -> List[KernelFinding]:
        coded = _INIT_CODED.match(said)
        if coded:
            self._coded_init.add(address)
            return [KernelFinding("init_failed", address=address, detail=coded.group(1))]
        if not _INIT_CALL.match(said):
            return []
        if address in self._coded_init:
            self._coded_init.discard(address)
            return []
        return [KernelFinding("init_failed", address=address, detail=_INIT_CALL_DETAIL)]

    def _fallen_starts(self, rest: str, device: Optional[str]) -> List[KernelFinding]:
        first, *more = _RECORD_LINES.split(rest)
        start = _FALLEN_START.match(first)
        self._fallen = (start.group(1), bool(start.group(2))) if start else None
        return [finding for line in more if line for finding in self.match(line, device)]

    def _fallen_continues(self, rest: str) -> Optional[List[KernelFinding]]:
        """The findings of a record that continues the message begun by "The NVIDIA GPU"; None where the
        record is not its next line (the message is then given up, and the record read on its own)."""
        address, has = self._fallen
        self._fallen = None
        if not has and _FALLEN_MIDDLE.match(rest):
            self._fallen = (address, True)
            return []
        if has and rest == _FALLEN_END:
            return [_implied_fallen(address)]
        return None


def _xid(rest: str) -> List[KernelFinding]:
    xid = _XID.match(rest)
    if not xid:
        return []
    bus_id, number, tail = xid.groups()
    code = int(number)
    pid, name, said = _process(tail)
    link = _XID_LINK.search(said) if code in _NVLINK_XIDS else None
    return [KernelFinding("xid", address=bus_id + ".0", code=code, pid=pid, process_name=name,
                          detail=_cut(said), link=int(link.group(1)) if link else None)]


def _process(tail: str) -> Tuple[Optional[int], Optional[str], str]:
    """The pid and process name the Xid names (None for the driver's <unknown>), and the text after them."""
    process = _PROCESS.match(tail)
    if not process:
        return None, None, tail
    pid, name = process.groups()
    name = name.strip() if name else None
    return int(pid) if pid else None, name if name and name != _UNKNOWN else None, tail[process.end():]


def _implied_fallen(address: str) -> KernelFinding:
    return KernelFinding("xid", address=address, code=_XID_FALLEN_OFF_THE_BUS, implied=True, detail=_FALLEN_DETAIL)


def _driver_loaded(rest: str) -> List[KernelFinding]:
    loaded = _LOADED.match(rest)
    return [KernelFinding("driver_loaded", detail=loaded.group(1))] if loaded else []


def _sxid(text: str) -> List[KernelFinding]:
    sxid = _SXID.match(text)
    if not sxid:
        return []
    address, number, severity, said = sxid.groups()
    link = _SXID_LINK.match(said)
    return [KernelFinding("sxid", address=address, code=int(number), severity=_SXID_SEVERITY[severity],
                          detail=_cut(said), link=int(link.group(1)) if link else None)]


def _nic(text: str) -> List[KernelFinding]:
    nic = _MLX5.match(text)
    if not nic:
        return []
    address, said = nic.groups()
    for severity, message in _NIC_MESSAGES:
        if message.match(said):
            return [KernelFinding("nic", address=address, severity=severity, detail=_cut(said))]
    return []


def _aer(text: str) -> List[KernelFinding]:
    aer = _AER.match(text)
    if not aer:
        return []
    reporter, severity, source = aer.groups()
    address = _requester(reporter, source[3:]) if source.startswith("id=") else source
    return [KernelFinding("aer", address=address, severity=_aer_severity(severity), detail=source,
                          reporter=reporter)]


def _aer_severity(printed: str) -> str:
    if printed.startswith("Correct"):
        return "corrected"
    return "nonfatal" if "Non-Fatal" in printed else "fatal"


def _requester(reporter: str, requester_id: str) -> str:
    """The function a requester ID names (bus << 8 | device << 3 | function), in the reporter's domain."""
    rid = int(requester_id, 16)
    return f"{reporter[:4]}:{rid >> 8:02x}:{(rid >> 3) & 0x1f:02x}.{rid & 0x7}"


def _kmsg_pci_address(device: Optional[str]) -> Optional[str]:
    pci = _KMSG_PCI_DEVICE.match(device) if device else None
    return pci.group(1) if pci else None


def _cut(said: str) -> Optional[str]:
    said = said.strip()
    return said[:MAX_DETAIL] if said else None
