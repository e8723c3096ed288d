"""The kernel's GPU-relevant messages, recognised from text recorded on real nodes (tests/data/kernel, each
file saying where it was captured) and from the formats the driver and kernel sources print."""

import copy
import os

import pytest

from gpu_monitoring.node.kernel_patterns import KINDS, MAX_DETAIL, KernelFinding, KernelPatterns

DATA = os.path.join(os.path.dirname(__file__), "data", "kernel")


def xid(address, code, detail, pid=None, name=None, link=None):
    return KernelFinding("xid", address=address, code=code, pid=pid, process_name=name, detail=detail, link=link)


def fallen(address):
    return KernelFinding("xid", address=address, code=79, implied=True, detail="GPU has fallen off the bus")


def uuid(address, value):
    return KernelFinding("gpu_uuid", address=address, uuid=value)


def init_failed(address, detail):
    return KernelFinding("init_failed", address=address, detail=detail)


def sxid(address, code, severity, detail, link):
    return KernelFinding("sxid", address=address, code=code, severity=severity, detail=detail, link=link)


def nic(address, severity, detail):
    return KernelFinding("nic", address=address, severity=severity, detail=detail)


def aer(address, severity, detail, reporter):
    return KernelFinding("aer", address=address, severity=severity, detail=detail, reporter=reporter)


def loaded(version):
    return KernelFinding("driver_loaded", detail=version)


RESET_REQUIRED = "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
GSP_TIMEOUT = "Timeout after 45s of waiting for RPC response from GPU{} GSP! Expected function 76 (GSP_RM_CONTROL) {}"
NETIR = "NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x0{}001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
MINION = "Link {} Minion Link DLREQ interrupt"

# Each fixture's findings by its line number (comment lines counted); every other line gives none.
EXPECTED = {
    "leptonai-gpud-46-xid-13-109.txt": {
        5: [xid("0000:cb:00.0", 13,
                "Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter")],
        6: [xid("0000:cb:00.0", 13, "Graphics SM Global Exception on (GPC 7, TPC 7, SM 0): Multiple Warp Errors")],
        7: [xid("0000:cb:00.0", 13,
                "Graphics Exception: ESR 0x57c730=0xc04000b 0x57c734=0x24 0x57c728=0x1f81fb60 0x57c72c=0x1174")],
        8: [xid("0000:cb:00.0", 109, "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005",
                pid=1797828, name="pt_main_thread")],
    },
    "open-gpu-kernel-modules-446-a100-sxid.txt": {
        5: [uuid("0000:48:00.0", "GPU-5fc0bcec-c2e1-38dc-8994-2a9f9f3b709e")],
        9: [xid("0000:48:00.0", 62, "00002740 00002b08 00001126 0000117a 0000279f 0002a91a 00000011 00000000")],
        10: [xid("0000:48:00.0", 45, "channel 0x0000000a", pid=22884, name="VLLM::Worker")],
        11: [xid("0000:48:00.0", 45, "channel 0x0000000b", pid=22884, name="VLLM::Worker")],
    },
    "vllm-40652-a100-nvlink.txt": {
        5: [xid("0000:48:00.0", 45, "channel 0x00000010 caused by previous Xid 45", pid=22884, name="VLLM::Worker")],
        6: [xid("0000:48:00.0", 45, "channel 0x00000011 caused by previous Xid 45", pid=22884, name="VLLM::Worker")],
        7: [xid("0000:48:00.0", 74, "NVLink: fatal error detected on link 8(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
                pid=22884, name="VLLM::Worker_TP")],
        8: [xid("0000:48:00.0", 154, RESET_REQUIRED)],
        11: [uuid("0000:0b:00.0", "GPU-ff3dfd6d-7042-cc8c-f3a6-84d9d6eb3a4b")],
        15: [xid("0001:6c:00.0", 119, GSP_TIMEOUT.format(5, "sequence 24174 (0x20801322 0x808)."),
                 pid=10200, name="NvmlTaskRunner")],
    },
    "open-gpu-kernel-modules-1118-gsp-timeout.txt": {
        5: [xid("0000:0b:00.0", 119, GSP_TIMEOUT.format(3, "sequence 4129 (0x20803039 0xb0)."),
                pid=11431, name="gpu-feature-dis")],
    },
    "open-gpu-kernel-modules-1150-xid45.txt": {
        4: [xid("0000:dc:00.0", 45, "Ch 00000001 caused by previous Xid 149", pid=1818990, name="python3")],
        5: [xid("0000:ed:00.0", 45, "Ch 0000000c caused by previous Xid 145", pid=1818992, name="python3")],
        6: [xid("0000:ba:00.0", 45, "Ch 00000002 caused by previous Xid 145", pid=1818989, name="python3")],
        7: [xid("0000:97:00.0", 45, "Ch 00000003 caused by previous Xid 145", pid=1818987, name="python3")],
        8: [xid("0000:97:00.0", 45, "Ch 00000004", pid=1818987, name="python3")],
    },
    "leptonai-gpud-1160-1174-nvlink-xid.txt": {
        3: [xid("0000:01:00.0", 144, "SAW_MVB Nonfatal XC0 i0 Link 0 (0x00000001 0x00000008 0x00000000 0x00000000 "
                                     "0x00000000 0x00000000)", link=0)],
        4: [xid("0000:00:00.0", 149, NETIR.format(26), link=0)],
        5: [xid("0000:00:00.0", 149, NETIR.format(25), link=0)],
        6: [xid("0019:01:00.0", 149, "NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 0x00000000 "
                                     "0x00000000 0x00000000)")],
        7: [xid("0000:00:00.0", 149, NETIR.format(25), link=0)],
        8: [xid("0018:01:00.0", 145, "RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 "
                                     "0x00100000 0x00000004)", link=13)],
    },
    "nccl-2241-redacted-xid.txt": {},
    "nvidia-forums-364958-xid154.txt": {
        6: [xid("0000:01:00.0", 120, "GSP kernel exception: store access page fault (cause:0xf) @ "
                                     "pc:0xffffffff93003d42, partition:4#0")],
        7: [xid("0000:01:00.0", 154, RESET_REQUIRED)],
        8: [xid("0000:01:00.0", 62, "223b6a66 00002100 00000000 20662342 20662ba6 20664272 2065f7ca 2063f48c")],
        10: [xid("0000:01:00.0", 154, RESET_REQUIRED)],
        11: [xid("0000:01:00.0", 45, "channel 0x00000002", pid=12542, name="VLLM::Worker")],
    },
    "bumblebee-677-xid-without-process.txt": {
        4: [xid("0000:01:00.0", 32, "Channel ID 00000000 intr 00004000")],
        5: [xid("0000:01:00.0", 32, "Channel ID 00000000 intr 00004000")],
        6: [xid("0000:01:00.0", 31, "Ch 00000003, engmask 00000101, intr 10000000")],
    },
    "nvidia-xid-errors-r384.txt": {
        4: [uuid("0000:03:00.0", "GPU-b850f46d-d5ea-c752-ddf3-c4453e44d3f7")],
        5: [xid("0000:03:00.0", 14, "Channel 00000001")],
    },
    "leptonai-gpud-sxid-readme-xid79.txt": {
        5: [uuid("0000:91:00.0", "GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b")],
        7: [xid("0000:91:00.0", 79, "GPU has fallen off the bus.")],
        8: [fallen("0000:91:00.0")],
        10: [sxid("0000:06:00.0", 20034, "fatal", "Link 48 LTSSM Fault Up", 48)],
        11: [sxid("0000:05:00.0", 20034, "fatal", "Link 63 LTSSM Fault Up", 63)],
        14: [sxid("0000:07:00.0", 20034, "fatal", "Link 37 LTSSM Fault Up", 37)],
        15: [sxid("0000:05:00.0", 20034, "fatal", "Link 62 LTSSM Fault Up", 62)],
    },
    "nvtrust-124-sxid-nonfatal.txt": {
        4: [loaded("570.195.03")],
        6: [sxid("0000:04:00.0", 22013, "nonfatal", MINION.format(44), 44)],
        9: [sxid("0000:04:00.0", 22013, "nonfatal", MINION.format(45), 45)],
        12: [sxid("0000:04:00.0", 22013, "nonfatal", MINION.format(46), 46)],
    },
    "nvsentinel-155-fallen-off-bus.txt": {
        7: [fallen("0000:b3:00.0")],
        9: [loaded("570.158.01")],
    },
    "gpu-operator-649-rminitadapter.txt": {
        5: [init_failed("0000:04:01.0", "rm_init_adapter failed")],
        6: [init_failed("0000:04:01.0", "0x11:0x45:2525")],
        8: [init_failed("0000:04:02.0", "0x11:0x45:2525")],
        15: [init_failed("0000:04:01.0", "0x11:0x45:2525")],
    },
    "cuda-samples-104-rminitadapter-oops.txt": {5: [init_failed("0000:13:00.0", "0x26:0x56:1463")]},
    "open-gpu-kernel-modules-789-gsp-init.txt": {5: [init_failed("0000:98:00.0", "0x62:0x65:1792")]},
    "bumblebee-722-rminitadapter-358.txt": {
        4: [init_failed(None, "0x26:0xffff:1375")],
        7: [init_failed(None, "0x26:0xffff:1375")],
    },
    "bumblebee-111-rminitadapter-280.txt": {
        8: [loaded("280.13")],
        10: [init_failed(None, "0x30:0xffffffff:859")],
    },
    "rockchip-pcie-devices-2-aarch64.txt": {
        4: [init_failed("0000:01:00.0", "0x25:0x65:1468")],
        13: [loaded("535.161.07")],
    },
    "raspberry-pi-pcie-devices-692-open-aarch64.txt": {8: [loaded("580.95.05")]},
    "returnn-1500-aer-fatal.txt": {8: [aer("0000:00:03.0", "fatal", "0000:00:03.0", "0000:00:03.0")]},
    "nbfc-181-aer-requester-id.txt": {4: [aer("0000:00:1c.5", "corrected", "id=00e5", "0000:00:1c.5")]},
    "hid-asus-dkms-33-aer-multiple.txt": {
        5: [aer("0000:00:1c.5", "corrected", "id=00e5", "0000:00:1c.5")],
        7: [aer("0000:00:1c.5", "corrected", "id=00e5", "0000:00:1c.5")],
    },
    "dasharo-issues-639-aer-endpoint.txt": {
        4: [aer("0000:2d:00.0", "corrected", "0000:2d:00.0", "0000:00:1c.0")],
        8: [aer("0000:2d:00.0", "corrected", "0000:2d:00.0", "0000:00:1c.0")],
    },
    "gsconnect-1052-aer-tagged-details.txt": {
        4: [aer("0000:00:1c.5", "corrected", "0000:00:1c.5", "0000:00:1c.5")],
        8: [aer("0000:00:1c.5", "corrected", "0000:00:1c.5", "0000:00:1c.5")],
    },
    "ms-02-ultra-10-aer-message-received.txt": {
        7: [aer("0000:80:1b.4", "corrected", "0000:80:1b.4", "0000:80:1b.4")],
        8: [aer("0000:80:1b.4", "nonfatal", "0000:80:1b.4", "0000:80:1b.4")],
    },
    "pop-3363-aer-nvidia-endpoint.txt": {
        5: [aer("0000:00:00.0", "corrected", "0000:00:00.0", "0000:00:03.1")],
        15: [aer("0000:00:00.0", "corrected", "0000:00:00.0", "0000:00:03.1")],
    },
    "nvidia-bluefield-nic-mode-mlx5-health.txt": {
        5: [nic("0000:05:00.0", "fatal", "device's health compromised - reached miss count")],
    },
    "nvsentinel-nic-syslog-doc-mlx5.txt": {
        5: [nic("0000:12:00.0", "warning", "Detected insufficient power on the PCIe slot (27W).")],
        6: [nic("0000:5c:00.0", "warning", "Port module event[error]: module 0, Cable error, High Temperature")],
        8: [nic("0000:d2:00.0", "fatal", "device's health compromised - reached miss count.")],
    },
    "csdn-147170729-mlx5-cable-plugged.txt": {},
    "tinycore-redpill-9-mlx5-probe.txt": {},
    "leptonai-gpud-1209-journal-kernel.txt": {},
}


def read_fixture(name):
    with open(os.path.join(DATA, name), encoding="utf-8") as f:
        return f.read().split("\n")


def findings_by_line(lines):
    patterns = KernelPatterns()
    found = {}
    for number, line in enumerate(lines, 1):
        if line and not line.startswith("#"):
            findings = patterns.match(line)
            if findings:
                found[number] = findings
    return found


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recorded_kernel_text_gives_exactly_its_findings(name):
    assert findings_by_line(read_fixture(name)) == EXPECTED[name]


def test_every_recording_is_checked_and_says_where_it_comes_from():
    assert sorted(os.listdir(DATA)) == sorted(EXPECTED)
    for name in EXPECTED:
        lines = read_fixture(name)
        assert lines[0].startswith("# ") and lines[1].startswith("#"), name
        assert any(line and not line.startswith("#") for line in lines), name


def test_every_finding_is_of_a_known_kind():
    kinds = {finding.kind for findings in EXPECTED.values() for found in findings.values() for finding in found}
    assert kinds == set(KINDS)


def match(*texts, device=None):
    """The findings of records given to one KernelPatterns in turn."""
    patterns = KernelPatterns()
    return [finding for text in texts for finding in patterns.match(text, device)]


# --- Xid lines (formats of kernel_rc.c krcReportXid_IMPL) ---

def test_an_xid_names_the_process_the_driver_names():
    assert match("NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of waiting") == [
        xid("0000:9b:00.0", 119, "Timeout after 6s of waiting", pid=2024380, name="nvidia-smi")]


def test_an_xid_on_a_mig_gpu_is_the_gpus():
    # " GPU-I:%02u" and " GPU-I:%02u GPU-CI:%02u" inside the parenthesis.
    assert match("NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, name=python, Contained: CE User Channel (0x9)",
                 "NVRM: Xid (PCI:0000:01:00 GPU-I:05 GPU-CI:01): 43, pid=7194, name=python, Ch 00000010") == [
        xid("0000:01:00.0", 94, "Contained: CE User Channel (0x9)", pid=7194, name="python"),
        xid("0000:01:00.0", 43, "Ch 00000010", pid=7194, name="python")]


def test_an_xid_with_a_pid_and_no_name():
    # The form kern_gpu_error_cont_ga100.c documents: "94, pid=7062, Contained: ...".
    assert match("NVRM: Xid (PCI:0000:01:00): 94, pid=7062, Contained: CE User Channel (0x9). RST: No, D-RST: No") == [
        xid("0000:01:00.0", 94, "Contained: CE User Channel (0x9). RST: No, D-RST: No", pid=7062)]


def test_an_xid_with_no_message_has_no_detail():
    assert match("NVRM: Xid (PCI:0000:04:00): 79, pid='<unknown>', name=<unknown>, ",
                 "NVRM: Xid (PCI:0000:04:00): 79,") == [xid("0000:04:00.0", 79, None), xid("0000:04:00.0", 79, None)]


def test_a_recovery_action_xid_keeps_the_action_it_names():
    # gpu.c: "GPU recovery action changed from 0x%x (%s) to 0x%x (%s)".
    action = "GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)"
    assert match("NVRM: Xid (PCI:0000:9b:00): 154, " + action) == [xid("0000:9b:00.0", 154, action)]


def test_only_nvlink_xids_name_a_link():
    assert match("NVRM: Xid (PCI:0000:0a:00): 150, MSE Fatal XC0 i0 Link 17 (0x1)")[0].link == 17
    assert match("NVRM: Xid (PCI:0000:0a:00): 143, Link 17 of something")[0].link is None


def test_a_malformed_pid_is_left_in_the_detail():
    assert match("NVRM: Xid (PCI:0000:9b:00): 13, pid=12ab, name=x, Graphics Exception") == [
        xid("0000:9b:00.0", 13, "pid=12ab, name=x, Graphics Exception")]


@pytest.mark.parametrize("text", [
    "NVRM: Xid (PCI:0000:9b:00): abc, pid=1, name=x, text",  # no code
    "NVRM: Xid (PCI:0000:9b:00): 123456, text",  # more digits than any Xid
    "NVRM: Xid (PCI:0000:9b:00): -13, text",
    "NVRM: Xid (PCI:0000:9b:00) 13, text",
    "NVRM: Xid (PCI:0000:9b): 13, text",  # no device number
    "NVRM: Xid (PCI:0000:9b:00.0): 13, text",
    "NVRM: Xid (PCI:0000:9B:00): 13, text",  # the driver prints lower case
    "NVRM: Xid (PCI:0000:9b:00): 13text",
    "NVRM: Xid 13 on 0000:9b:00",
    "nvidia: NVRM: Xid (PCI:0000:9b:00): 13, text",  # not the driver's record
    "NVRM: GPU0 _kgspRpcGspEventPmuHalted: Received signal from GSP that PMU has halted.",
])
def test_near_misses_of_an_xid_give_nothing(text):
    assert match(text) == []


# --- GPU UUID, fallen off the bus, initialisation, banner ---

@pytest.mark.parametrize("text", [
    "NVRM: GPU at 0000:01:00.0 has software scheduler enabled with policy BEST_EFFORT on GR",  # gpu.c
    "NVRM: GPU at PCI:0000:48:00: GPU-5fc0bcec-c2e1-38dc-8994",
    "NVRM: GPU at PCI:0000:48:00: MIG-5fc0bcec-c2e1-38dc-8994-2a9f9f3b709e",
    "NVRM: GPU Board Serial Number: 1563521020414",
    "NVRM: GPU 0000:91:00.0: GPU serial number is 1653723052734.",
    "NVRM: GPU 0000:82:00.0: Failed to enable MSI-X.",
])
def test_other_gpu_lines_give_nothing(text):
    assert match(text) == []


OPENING = "NVRM: The NVIDIA GPU 0000:18:00.0"
MIDDLE = "NVRM: (PCI ID: 10de:2901) installed in this system has"
ENDING = "NVRM: fallen off the bus and is not responding to commands."


def test_the_three_line_fallen_off_the_bus_message_is_counted_at_its_end():
    patterns = KernelPatterns()
    assert [patterns.match(OPENING), patterns.match(MIDDLE), patterns.match(ENDING)] == [
        [], [], [fallen("0000:18:00.0")]]


@pytest.mark.parametrize("separator", ["\n", "\\x0a"])
def test_the_fallen_off_the_bus_message_in_one_record(separator):
    # kmsg keeps one printk as one record and escapes its newlines as \x0a; a reader may unescape them.
    assert match(separator.join([OPENING, MIDDLE, ENDING]) + separator) == [fallen("0000:18:00.0")]


@pytest.mark.parametrize("between", [
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.127.05  Tue Oct  8 03:16:39 UTC 2024",
    "nvidia: probe of 0000:18:00.0 failed with error -1",
    "pcieport 0000:17:01.0: AER: Corrected error received: 0000:18:00.0",
])
def test_an_unrelated_record_in_between_breaks_the_message(between):
    assert [f for f in match(OPENING, between, MIDDLE, ENDING) if f.implied] == []
    assert [f for f in match(OPENING, MIDDLE, between, ENDING) if f.implied] == []


def test_the_same_opening_with_another_ending_gives_nothing():
    # osapi.c's message for a GPU the driver does not support begins with the same words.
    assert match("NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:1e04)",
                 "NVRM: installed in this system is not supported by the",
                 "NVRM: NVIDIA 550.127.05 driver release.",
                 ENDING) == []
    assert match(OPENING, ENDING) == []
    assert match(MIDDLE, ENDING) == []
    assert match(ENDING) == []


def test_the_opening_may_carry_the_pci_id_and_the_middle_words():
    assert match("NVRM: The NVIDIA GPU 0000:04:00.0 (PCI ID: 10de:2c02) installed in this system has", ENDING) == [
        fallen("0000:04:00.0")]


def test_a_new_opening_replaces_an_unfinished_one():
    assert match(OPENING, "NVRM: The NVIDIA GPU 0000:2a:00.0", MIDDLE, ENDING) == [fallen("0000:2a:00.0")]


def test_the_single_line_fallen_off_the_bus_message():
    assert match("NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.") == [fallen("0000:18:00.0")]


def test_an_xid_79_line_is_an_ordinary_xid():
    assert match("NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus") == [
        xid("0000:44:00.0", 79, "GPU has fallen off the bus")]


def test_an_initialisation_failure_is_counted_once_at_its_code():
    assert match("NVRM: GPU 0000:c1:00.0: RmInitAdapter failed! (0x26:0x56:1474)",
                 "NVRM: GPU 0000:c1:00.0: rm_init_adapter failed, device minor number 3") == [
        init_failed("0000:c1:00.0", "0x26:0x56:1474")]


def test_a_call_line_of_another_gpu_is_not_the_pairs_second_half():
    assert match("NVRM: GPU 0000:c1:00.0: RmInitAdapter failed! (0x26:0x56:1474)",
                 "NVRM: GPU 0000:c2:00.0: rm_init_adapter failed, device minor number 4",
                 "NVRM: GPU 0000:c1:00.0: rm_init_adapter failed, device minor number 3",
                 "NVRM: GPU 0000:c1:00.0: rm_init_adapter failed, device minor number 3") == [
        init_failed("0000:c1:00.0", "0x26:0x56:1474"),
        init_failed("0000:c2:00.0", "rm_init_adapter failed"),
        init_failed("0000:c1:00.0", "rm_init_adapter failed")]


def test_an_old_initialisation_failure_takes_the_gpu_from_kmsgs_device():
    assert match("NVRM: RmInitAdapter failed! (0x25:0x65:1203)", device="+pci:0000:c1:00.0") == [
        init_failed("0000:c1:00.0", "0x25:0x65:1203")]
    assert match("NVRM: RmInitAdapter failed! (0x25:0x65:1203)", device="c189:0") == [
        init_failed(None, "0x25:0x65:1203")]


@pytest.mark.parametrize("text", [
    "NVRM: RmInitAdapter: Cannot initialize GSP firmware RM",
    "NVRM: GPU 0000:c1:00.0: RmInitAdapter failed! (0x26:0x56)",
    "NVRM: GPU 0000:c1:00.0: RmInitAdapter failed! (0x26:0x56:1474) and more",
    "NVRM: rm_init_adapter failed for the GPU",
    "NVRM: nvidia_frontend_open: minor 0, module->open() failed, error -5",
    "NVRM: The NVIDIA probe routine failed for 1 device(s).",
])
def test_near_misses_of_an_initialisation_failure_give_nothing(text):
    assert match(text) == []


@pytest.mark.parametrize("text", [
    "nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver for UNIX platforms  535.161.07  Sat Feb 17 2024",
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module",
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  five  Tue Oct  8 2024",
    "nvidia-uvm: Loaded the UVM driver, major device number 502.",
])
def test_other_banners_are_not_the_drivers(text):
    assert match(text) == []


# --- NVSwitch SXids (common_nvswitch.h, intr_nvswitch.h) ---

def test_an_sxid_without_a_link():
    assert match("nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 12001, Fatal, Unexpected PRI error") == [
        sxid("0000:07:00.0", 12001, "fatal", "Unexpected PRI error", None)]


@pytest.mark.parametrize("text", [
    "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Severity 1 Engine instance 60 Sub-engine instance 00",
    "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Data {0x10000000, 0x10000000, 0x00000000}",
    "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 200340, Fatal, Link 48 LTSSM Fault Up",
    "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): garbled, Fatal",
    "nvidia-nvswitch1: SXid (PCI:0000:06:00): 20034, Fatal, Link 48 LTSSM Fault Up",
    "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, fatal, Link 48 LTSSM Fault Up",
    "nvidia-nvswitch: Probing device 0000:08:00.0, Vendor Id = 0x10de, Device Id = 0x22a3, Class = 0x68000",
    "nvidia-nvswitch3: using MSI",
])
def test_sxid_follow_on_records_and_near_misses_give_nothing(text):
    assert match(text) == []


# --- ConnectX (health.c, events.c) ---

@pytest.mark.parametrize("text, finding", [
    ("mlx5_core 0000:0c:00.0: poll_health:802:(pid 0): Fatal error 1 detected",
     nic("0000:0c:00.0", "fatal", "Fatal error 1 detected")),
    ("mlx5_core 0000:0c:00.0: 0000:0c:00.0:poll_health:188:(pid 0): device's health compromised",
     nic("0000:0c:00.0", "fatal", "device's health compromised")),
    ("mlx5_core 0000:0c:00.0: port_module:256:(pid 0): Port module event: module 1, Cable unplugged",
     nic("0000:0c:00.0", "warning", "Port module event: module 1, Cable unplugged")),
    ("mlx5_core 0000:0c:00.0: port_module:256:(pid 0): Port module event: module 1, Cable disabled",
     nic("0000:0c:00.0", "warning", "Port module event: module 1, Cable disabled")),
    ("mlx5_core 0000:0c:00.0: mlx5_port_module_event:1131:(pid 0): Port module event[error]: module 0, Cable "
     "error, Bad or shorted cable/module",
     nic("0000:0c:00.0", "warning", "Port module event[error]: module 0, Cable error, Bad or shorted cable/module")),
    ("mlx5_core 0000:0c:00.0: temp_warn:174:(pid 0): High temperature on sensors with bit set 0 1",
     nic("0000:0c:00.0", "warning", "High temperature on sensors with bit set 0 1")),
])
def test_connectx_health_and_module_events(text, finding):
    assert match(text) == [finding]


@pytest.mark.parametrize("text", [
    "mlx5_core 0000:0c:00.0: Port module event: module 0, Cable plugged",
    "mlx5_core 0000:0c:00.0 ens1: Link up",
    "mlx5_core 0000:0c:00.0 ens1: Link down",
    "mlx5_core 0000:d2:00.0: mlx5_cmd_out_err:838:(pid 1441871): ACCESS_REG(0x805) op_mod(0x1) failed, status bad "
    "operation(0x2), syndrome (0x305684), err(-22)",
    "mlx5_core 0000:0c:00.0: E-Switch: Total vports 10, per vport: max uc(128) max mc(2048)",
    "mlx5_core 0000:05:00.0: print_health_info:429:(pid 0): Health issue observed, firmware internal error, "
    "severity(2) CRITICAL:",
    "mlx5_core 0000:0c:00.0: mlx5_health_try_recover:389:(pid 123): health recovery failed",
    "mlx5_core 0000:0c:00.0: Fatal error 1 detected soon",
    "mlx5_core: probe of 0000:03:00.0 failed with error -22",
    "mlx5_core.sf.2: poll_health:802:(pid 0): Fatal error 1 detected",
    "mlx4_core 0000:0c:00.0: device's health compromised",
])
def test_other_connectx_chatter_gives_nothing(text):
    assert match(text) == []


# --- PCIe AER (aer.c) ---

@pytest.mark.parametrize("printed, severity", [
    ("Corrected", "corrected"), ("Correctable", "corrected"),
    ("Uncorrected (Non-Fatal)", "nonfatal"), ("Uncorrectable (Non-Fatal)", "nonfatal"),
    ("Uncorrected (Fatal)", "fatal"), ("Uncorrectable (Fatal)", "fatal"),
])
def test_every_aer_severity(printed, severity):
    assert match(f"pcieport 0000:00:01.0: AER: {printed} error received: 0000:01:00.0",
                 f"pcieport 0000:00:01.0: AER: Multiple {printed} error message received from 0000:01:00.0") == [
        aer("0000:01:00.0", severity, "0000:01:00.0", "0000:00:01.0")] * 2


def test_a_requester_id_is_read_in_the_reporters_domain():
    # id = bus << 8 | device << 3 | function.
    assert match("pcieport 0001:00:01.0: AER: Uncorrected (Fatal) error received: id=9b08") == [
        aer("0001:9b:01.0", "fatal", "id=9b08", "0001:00:01.0")]
    assert match("pcieport 0000:00:01.0: AER: Corrected error received: id=0010")[0].address == "0000:00:02.0"


def test_a_source_the_kernel_found_no_details_for_still_counts():
    assert match("pcieport 0000:00:01.0: AER: Correctable error message received from 0000:01:00.0 "
                 "(no details found") == [aer("0000:01:00.0", "corrected", "0000:01:00.0", "0000:00:01.0")]


@pytest.mark.parametrize("text", [
    "nvidia 0000:9b:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)",
    "nvidia 0000:9b:00.0:   device [10de:2330] error status/mask=00000001/0000e000",
    "nvidia 0000:9b:00.0:    [ 0] RxErr                  (First)",
    "nvidia 0000:9b:00.0: AER: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)",
    "nvidia 0000:9b:00.0: AER: can't recover (no error_detected callback)",
    "pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00",
    "pcieport 0000:00:01.0: AER: Corrected error received: id=00e",
    "pcieport 0000:00:01.0: AER: Mysterious error received: 0000:01:00.0",
    "pcieport 0000:00:01.0: AER: enabled with IRQ 27",
    "pcieport 0000:00:01.0: can't find device of ID00e5",
])
def test_aer_detail_lines_and_near_misses_give_nothing(text):
    assert match(text) == []


# --- what every finding is held to ---

@pytest.mark.parametrize("text", [
    "NVRM: Xid (PCI:0000:9b:00): 13, pid=1, name=x, " + "E" * 500,
    "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 24007, Fatal, Link 30 " + "E" * 500,
    "mlx5_core 0000:0c:00.0: Port module event[error]: module 0, Cable error, " + "E" * 500,
])
def test_a_long_detail_is_cut(text):
    (finding,) = match(text)
    assert len(finding.detail) == MAX_DETAIL and text.endswith(finding.detail[-10:])


@pytest.mark.parametrize("text", [
    "",
    "systemd[1]: Started systemd-journald.service - Journal Service.",
    "EXT4-fs (md127p3): re-mounted 0f3cd65a-338b-4574-bba3-ecef214e1917 r/w. Quota mode: none.",
    "NVRM",
    "NVRM: ",
    "nvidia-nvswitch",
    "mlx5_core ",
    ": AER: ",
])
def test_other_tenants_messages_leave_nothing_behind(text):
    patterns = KernelPatterns()
    before = copy.deepcopy(vars(patterns))
    assert patterns.match(text) == []
    assert vars(patterns) == before
