"""What an NVML driver answers to everything the check asks, and what the check costs against it.

    python scripts/driver_report.py [--simulate SCENARIO] [--runs N] > report.json
    python scripts/driver_report.py --compare real.json simulated.json

For a real GPU node and a simulated one alike: the driver's versions; per GPU, each NVML query
the check makes (and a few it relies on not answering), each field ID it batches with its
status, value type and value, and each dedicated function that stands in for a refused field,
beside the field's value; then the check's NVML calls per GPU per steady run, by function, and
its CPU per run against the submission floor (the driver's time inside NVML measured apart).
`--compare` lines two reports up and prints where the simulated driver answers differently
(a status, a value type, a refusal), which is what the simulator must be fixed to match.
"""

import argparse
import ctypes
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import pynvml  # noqa: E402

from gpu_monitoring.nvml.readings import READINGS  # noqa: E402

LINKS = 18  # NVML_NVLINK_MAX_LINKS on Hopper
CLOCKS = {"graphics": pynvml.NVML_CLOCK_GRAPHICS, "sm": pynvml.NVML_CLOCK_SM, "memory": pynvml.NVML_CLOCK_MEM,
          "video": pynvml.NVML_CLOCK_VIDEO}
THRESHOLDS = {"shutdown": pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
              "slowdown": pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
              "memory_max": pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX,
              "gpu_max": pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX}
ECC = {"corrected": pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, "uncorrected": pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED}
NVLINK_COUNTERS = {"replay": pynvml.NVML_NVLINK_ERROR_DL_REPLAY, "recovery": pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
                   "crc_flit": pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT, "crc_data": pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA}
VALUE_TYPES = {getattr(pynvml, n): n[len("NVML_VALUE_TYPE_"):] for n in dir(pynvml) if n.startswith("NVML_VALUE_TYPE_")}
ERRORS = {getattr(pynvml, n): n[len("NVML_ERROR_"):] for n in dir(pynvml)
          if n.startswith("NVML_ERROR_") and isinstance(getattr(pynvml, n), int)}


# --- what the driver answers ---------------------------------------------------------------

def plain(value: Any) -> Any:
    """An NVML answer as JSON: structures as dicts, arrays as lists, bytes as text."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, ctypes.Structure):
        return {name: plain(getattr(value, name)) for name, *_ in value._fields_}
    if isinstance(value, ctypes.Array):
        return [plain(v) for v in value]
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return {k: plain(v) for k, v in vars(value).items()}
    return value


def ask(call: Callable[[], Any]) -> Any:
    try:
        return plain(call())
    except pynvml.NVMLError as e:
        return {"error": ERRORS.get(e.value, str(e.value))}
    except Exception as e:  # a binding that does not match the library, say: the report goes on
        return {"error": f"{type(e).__name__}: {e}"}


def queries(handle: Any) -> Dict[str, Callable[[], Any]]:
    """Every query the check makes of a GPU (once a session or every run), by a name that says
    which with its arguments, and the thresholds and process lists it could ask besides."""
    p = pynvml
    asked: Dict[str, Callable[[], Any]] = {
        "name": lambda: p.nvmlDeviceGetName(handle),
        "architecture": lambda: p.nvmlDeviceGetArchitecture(handle),
        "pci_bus_id": lambda: p.nvmlDeviceGetPciInfo_v3(handle).busId,
        "minor_number": lambda: p.nvmlDeviceGetMinorNumber(handle),
        "mig_mode": lambda: p.nvmlDeviceGetMigMode(handle),
        "max_mig_devices": lambda: p.nvmlDeviceGetMaxMigDeviceCount(handle),
        "power_usage": lambda: p.nvmlDeviceGetPowerUsage(handle),
        "enforced_power_limit": lambda: p.nvmlDeviceGetEnforcedPowerLimit(handle),
        "energy": lambda: p.nvmlDeviceGetTotalEnergyConsumption(handle),
        "temperature": lambda: p.nvmlDeviceGetTemperature(handle, p.NVML_TEMPERATURE_GPU),
        "fan_speed": lambda: p.nvmlDeviceGetFanSpeed(handle),
        "performance_state": lambda: p.nvmlDeviceGetPerformanceState(handle),
        "clock_event_reasons": lambda: p.nvmlDeviceGetCurrentClocksEventReasons(handle),
        "pcie_link": lambda: (p.nvmlDeviceGetCurrPcieLinkGeneration(handle),
                              p.nvmlDeviceGetCurrPcieLinkWidth(handle)),
        "pcie_link_max": lambda: (p.nvmlDeviceGetMaxPcieLinkGeneration(handle),
                                  p.nvmlDeviceGetMaxPcieLinkWidth(handle)),
        "pcie_replay": lambda: p.nvmlDeviceGetPcieReplayCounter(handle),
        "pcie_throughput_tx": lambda: p.nvmlDeviceGetPcieThroughput(handle, p.NVML_PCIE_UTIL_TX_BYTES),
        "utilization_rates": lambda: p.nvmlDeviceGetUtilizationRates(handle),
        "encoder_utilization": lambda: p.nvmlDeviceGetEncoderUtilization(handle),
        "decoder_utilization": lambda: p.nvmlDeviceGetDecoderUtilization(handle),
        "memory_info_v2": lambda: p.nvmlDeviceGetMemoryInfo(handle, version=p.nvmlMemory_v2),
        "bar1_memory_info": lambda: p.nvmlDeviceGetBAR1MemoryInfo(handle),
        "remapped_rows": lambda: p.nvmlDeviceGetRemappedRows(handle),
        "retired_pages_pending": lambda: p.nvmlDeviceGetRetiredPagesPendingStatus(handle),
        "compute_processes": lambda: p.nvmlDeviceGetComputeRunningProcesses(handle),
        "mps_processes": lambda: p.nvmlDeviceGetMPSComputeRunningProcesses(handle),
        "process_utilization": lambda: p.nvmlDeviceGetProcessUtilization(handle, 0),
        "gpm_supported": lambda: p.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice,
        "supported_event_types": lambda: p.nvmlDeviceGetSupportedEventTypes(handle),
    }
    for name, clock in CLOCKS.items():
        asked[f"clock_{name}"] = lambda clock=clock: p.nvmlDeviceGetClockInfo(handle, clock)
        asked[f"max_clock_{name}"] = lambda clock=clock: p.nvmlDeviceGetMaxClockInfo(handle, clock)
    for name, threshold in THRESHOLDS.items():
        asked[f"temperature_threshold_{name}"] = lambda t=threshold: p.nvmlDeviceGetTemperatureThreshold(handle, t)
    for name, kind in ECC.items():
        asked[f"ecc_{name}_volatile"] = lambda k=kind: p.nvmlDeviceGetTotalEccErrors(handle, k, p.NVML_VOLATILE_ECC)
    for name, cause in (("single_bit", p.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
                        ("double_bit", p.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)):
        asked[f"retired_pages_{name}"] = lambda c=cause: len(p.nvmlDeviceGetRetiredPages(handle, c))
    for link in range(LINKS):
        asked[f"nvlink_state_{link}"] = lambda link=link: p.nvmlDeviceGetNvLinkState(handle, link)
    for name, counter in NVLINK_COUNTERS.items():
        asked[f"nvlink_error_{name}_link0"] = lambda c=counter: p.nvmlDeviceGetNvLinkErrorCounter(handle, 0, c)
    return asked


def field_keys() -> List[Tuple[str, int]]:
    keys = [(name, 0) for name in READINGS]
    keys += [(name, link) for name in ("nvlink_state", "nvlink_tx_kib", "nvlink_rx_kib") for link in range(1, LINKS)]
    return keys


def fields(handle: Any) -> Dict[str, Any]:
    """Each field the check batches, asked in one call as the check asks: status, type, value."""
    keys = field_keys()
    answers = pynvml.nvmlDeviceGetFieldValues(handle, [(READINGS[name].field_id, scope) for name, scope in keys])
    out = {}
    for (name, scope), entry in zip(keys, answers):
        status = ERRORS.get(entry.nvmlReturn, entry.nvmlReturn) if entry.nvmlReturn else "SUCCESS"
        value_type = VALUE_TYPES.get(entry.valueType, entry.valueType)
        value = getattr(entry.value, _UNION_MEMBER.get(entry.valueType, "ullVal")) if not entry.nvmlReturn else None
        out[f"{name}:{scope}"] = {"status": status, "type": value_type, "value": value}
    return out


_UNION_MEMBER = {pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal", pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
                 pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal", pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
                 pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal", pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal"}


def standing_in(device: Any) -> Dict[str, Any]:
    """What each dedicated function gives for the fields it stands in for, read through the check."""
    from gpu_monitoring.nvml.readings import Readings

    out: Dict[str, Any] = {}
    links = Readings(device).links
    readers = dict.fromkeys(reading.fallback for reading in READINGS.values() if reading.fallback)
    for reader in readers:
        out.update({f"{name}:0": value for name, value in reader(device, 0, links).items()})
    return out


def driver_answers(library: Any) -> Dict[str, Any]:
    from gpu_monitoring.nvml.session import NvmlSession

    session = NvmlSession(library)
    session.start()
    try:
        report = {"driver_version": session.driver_version, "nvml_version": session.nvml_version,
                  "cuda_driver_version": session.cuda_driver_version, "gpus": []}
        for device in session.devices:
            report["gpus"].append({"queries": {name: ask(call) for name, call in queries(device.handle).items()},
                                   "fields": fields(device.handle), "standing_in": standing_in(device)})
        return report
    finally:
        session.stop()


# --- what the check costs against it --------------------------------------------------------

class Counted:
    """A C function that counts its calls and the thread CPU spent inside them."""

    def __init__(self, name: str, function: Any, tally: "Tally") -> None:
        object.__setattr__(self, "_function", function)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_tally", tally)

    def __call__(self, *args: Any) -> Any:
        started = time.thread_time()
        try:
            return self._function(*args)
        finally:
            spent = time.thread_time() - started
            self._tally.calls[self._name] += 1
            self._tally.seconds[self._name] += spent
            self._tally.inside += spent

    def __getattr__(self, name: str) -> Any:
        return getattr(self._function, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._function, name, value)  # restype, argtypes: pynvml sets them on some functions


class Tally:
    def __init__(self) -> None:
        self.calls: Counter = Counter()
        self.seconds: Counter = Counter()  # thread CPU inside each function
        self.inside = 0.0
        self._original = pynvml._nvmlGetFunctionPointer

    def __enter__(self) -> "Tally":
        original = self._original
        pynvml._nvmlGetFunctionPointer = lambda name: Counted(name, original(name), self)
        return self

    def __exit__(self, *_exc: Any) -> None:
        pynvml._nvmlGetFunctionPointer = self._original


def check_costs(simulate: Optional[str], runs: int, interval: float) -> Dict[str, Any]:
    """NVML calls per GPU per steady run by function, and CPU per run against the floor; a real
    node waits `interval` seconds between runs (a simulated one moves its clock 15 s)."""
    from bench_support.floor import FloorCheck
    from bench_support.harness import reset_stubs, series_count, submitted

    from gpu_monitoring.check import GpuMonitoringCheck

    instance = {"simulate": simulate} if simulate else {}
    with Tally() as tally:  # every function is looked up through the tally from the first run on
        check = GpuMonitoringCheck("gpu_monitoring", {}, [instance])
        for _ in range(3):
            reset_stubs()
            _run(check)
        floor = FloorCheck(submitted())
        floor.run()
        tally.calls.clear()
        tally.seconds.clear()
        checks, owns, floors, series = [], [], [], 0
        for _ in range(runs):
            if simulate:
                check.simulated_node.nvml.advance(15)
            else:
                time.sleep(interval)
            reset_stubs()
            tally.inside = 0.0
            started = time.thread_time()
            _run(check)
            checks.append(time.thread_time() - started)
            owns.append(checks[-1] - tally.inside)
            series = series_count()
            reset_stubs()
            started = time.thread_time()
            floor.run()
            floors.append(time.thread_time() - started)
        calls, seconds = dict(tally.calls.most_common()), dict(tally.seconds)
    gpus = pynvml.nvmlDeviceGetCount()
    check_ms, own_ms, floor_ms = (statistics.median(cpu) * 1000 for cpu in (checks, owns, floors))
    return {
        "runs": runs, "gpus": gpus, "series": series, "floor_series": len(floor.series),
        "calls_per_gpu": {name: n / runs / gpus for name, n in calls.items()},
        "calls_per_gpu_total": sum(calls.values()) / runs / gpus,
        "cpu_us_per_call": {name: seconds[name] / n * 1e6 for name, n in calls.items()},
        "check_cpu_ms": check_ms, "inside_nvml_ms": sum(seconds.values()) / runs * 1000, "own_cpu_ms": own_ms,
        "floor_cpu_ms": floor_ms,
        "own_per_series_over_floor": (own_ms / series) / (floor_ms / len(floor.series)) if series else None,
    }


def _run(check: Any) -> None:
    error = check.run()
    if error:
        raise SystemExit(f"the check failed a run: {error}")


# --- comparing two reports -------------------------------------------------------------------

def compare(real: Dict[str, Any], simulated: Dict[str, Any]) -> List[str]:
    """Where the second report's first GPU answers differently in kind from the first's."""
    lines = []
    a, b = real["gpus"][0], simulated["gpus"][0]
    for name in a["queries"]:
        ka, kb = _kind(a["queries"][name]), _kind(b["queries"].get(name))
        if ka != kb:
            lines.append(f"query {name}: {a['queries'][name]!r} | {b['queries'].get(name)!r}")
    for key in a["fields"]:
        fa, fb = a["fields"][key], b["fields"].get(key) or {}
        if _field_kind(fa) != _field_kind(fb):
            lines.append(f"field {key}: {fa['status']} {fa['type']} {fa['value']!r} | "
                         f"{fb.get('status')} {fb.get('type')} {fb.get('value')!r}")
    for key in sorted(set(a["standing_in"]) | set(b["standing_in"])):
        ka, kb = _given(a["standing_in"].get(key)), _given(b["standing_in"].get(key))
        if ka != kb:
            lines.append(f"stand-in {key}: {a['standing_in'].get(key)!r} | {b['standing_in'].get(key)!r}")
    return lines


def _field_kind(entry: Dict[str, Any]) -> Tuple[Any, ...]:
    """A refused entry's value type means nothing: only an answer's is compared."""
    return (entry.get("status"), entry.get("type")) if entry.get("status") == "SUCCESS" else (entry.get("status"),)


def _given(answer: Any) -> str:
    """A stand-in's kind of answer: a reader gives nothing where it cannot answer, so an error an
    earlier report recorded for one counts as missing."""
    kind = _kind(answer)
    return "missing" if kind.startswith("error ") else kind


def _kind(answer: Any) -> str:
    if isinstance(answer, dict) and set(answer) == {"error"}:
        return f"error {answer['error']}"
    return "missing" if answer is None else type(answer).__name__


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--simulate", metavar="SCENARIO", help="a simulated node instead of the real driver")
    parser.add_argument("--runs", type=int, default=50, help="steady runs for calls and CPU (default 50)")
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between runs on a real node")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("REAL", "SIMULATED"))
    args = parser.parse_args()
    if args.compare:
        real, simulated = (json.loads(path.read_text()) for path in args.compare)
        lines = compare(real, simulated)
        print("\n".join(lines) if lines else "the simulated driver answers every query as the real one does")
        return 0
    library = None
    if args.simulate:
        from gpu_monitoring.simulator.library import SimulatedNvml
        from gpu_monitoring.simulator.scenario import load as load_scenario

        library = SimulatedNvml(load_scenario(args.simulate)).library
    report = driver_answers(library)
    report["check"] = check_costs(args.simulate, args.runs, args.interval)
    json.dump(report, sys.stdout, indent=1, default=repr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
