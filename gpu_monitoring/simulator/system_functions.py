"""Simulated NVML: initialisation, system queries, device enumeration and events."""

import ctypes

import pynvml

from gpu_monitoring.simulator.abi import nvml, put_int, put_pointer, put_string, put_uint, put_ulonglong, struct_at
from gpu_monitoring.simulator.fault_events import event_types
from gpu_monitoring.simulator.field_functions import driver_major

OK = pynvml.NVML_SUCCESS
SUPPORTED_EVENTS = (
    pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeSingleBitEccError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypePState
    | pynvml.nvmlEventTypeClock
)
_ERROR_STRINGS = {}


@nvml("u")
def nvmlInitWithFlags(sim, flags):
    sim.init_count += 1
    return OK


@nvml("")
def nvmlShutdown(sim):
    sim.init_count -= 1
    if sim.init_count == 0:
        sim.event_sets.clear()
        sim.gpm_samples.clear()
    return OK


@nvml("i", restype=ctypes.c_void_p)
def nvmlErrorString(sim, code):
    text = _ERROR_STRINGS.setdefault(code, ctypes.create_string_buffer(f"Simulated NVML error {code}".encode()))
    return ctypes.addressof(text)


@nvml("pu")
def nvmlSystemGetDriverVersion(sim, buffer, size):
    return _string(buffer, size, sim.scenario.driver["version"])


@nvml("pu")
def nvmlSystemGetNVMLVersion(sim, buffer, size):
    return _string(buffer, size, sim.scenario.driver["nvml_version"])


@nvml("p")
def nvmlSystemGetCudaDriverVersion(sim, out):
    put_int(out, sim.scenario.driver["cuda_version"])
    return OK


@nvml("p")
def nvmlSystemGetCudaDriverVersion_v2(sim, out):
    return nvmlSystemGetCudaDriverVersion(sim, out)


@nvml("p")
def nvmlDeviceGetCount_v2(sim, out):
    put_uint(out, len(sim.devices))
    return OK


@nvml("up")
def nvmlDeviceGetHandleByIndex_v2(sim, index, out):
    if index >= len(sim.devices):
        return pynvml.NVML_ERROR_INVALID_ARGUMENT
    put_pointer(out, sim.handle_of(sim.devices[index]))
    return OK


@nvml("p")
def nvmlEventSetCreate(sim, out):
    put_pointer(out, sim.create_event_set())
    return OK


@nvml("p")
def nvmlEventSetFree(sim, set_id):
    return OK if sim.event_sets.pop(set_id, None) is not None else pynvml.NVML_ERROR_INVALID_ARGUMENT


@nvml("hp")
def nvmlDeviceGetSupportedEventTypes(sim, target, out):
    put_ulonglong(out, _supported_events(sim))
    return OK


@nvml("hUp")
def nvmlDeviceRegisterEvents(sim, target, mask, set_id):
    event_set = sim.event_sets.get(set_id)
    if event_set is None:
        return pynvml.NVML_ERROR_INVALID_ARGUMENT
    if mask & ~_supported_events(sim) or mask & _refused_event_types(target):
        return pynvml.NVML_ERROR_NOT_SUPPORTED
    index = target.device.index
    event_set.registrations[index] = event_set.registrations.get(index, 0) | mask
    return OK


@nvml("ppu")
def nvmlEventSetWait_v2(sim, set_id, out, timeout_ms):
    event_set = sim.event_sets.get(set_id)
    if event_set is None:
        return pynvml.NVML_ERROR_INVALID_ARGUMENT
    if not sim.wait_for_event(event_set, timeout_ms / 1000.0):
        return pynvml.NVML_ERROR_TIMEOUT
    handle, event_type, data, gi, ci = event_set.queue.popleft()
    event = struct_at(pynvml.c_nvmlEventData_t, out)
    put_pointer(ctypes.addressof(event), handle)
    event.eventType = event_type
    event.eventData = data
    event.gpuInstanceId = gi
    event.computeInstanceId = ci
    return OK


def _string(buffer, size, text):
    return OK if put_string(buffer, size, text) else pynvml.NVML_ERROR_INSUFFICIENT_SIZE



def _supported_events(sim):
    """The event types the driver lists: the old ones, and those of fault_events its version has."""
    return SUPPORTED_EVENTS | event_types(driver_major(sim))


def _refused_event_types(target):
    """Types the device lists yet refuses to register (`refused_event_types`, pynvml names)."""
    return sum(getattr(pynvml, name) for name in target.device.spec.get("refused_event_types", []))
