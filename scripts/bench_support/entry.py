"""What a call into the simulated driver costs the calling thread beyond the simulator's own timing.

The simulated NVML functions are Python behind ctypes callbacks. Each times itself from its first
line to its last (`sim.cpu_seconds`), but the way in and out (ctypes converting the arguments
and the result for a Python callback, the interpreter entering the function, the timing's own
clock reads) falls on the caller's side of those lines. libnvidia-ml is C: calling it costs the
caller only ctypes' foreign call. So every call into the simulator costs the check this much
more than a call into the real library would, and the bench counts it as the driver's.

Measured once per process on a simulator of its own, initialised by its own C entry point so
pynvml's library (one per process) is left alone: a call of NVML's commonest shape (handle,
unsigned int, pointer) into the simulator, less the simulator's own time, against a call of the
same shape into a C function that writes nothing (`memcmp` of zero bytes).
"""

import ctypes
import functools
import statistics
import time
from dataclasses import dataclass

import pynvml

from gpu_monitoring.simulator.library import SimulatedNvml
from gpu_monitoring.simulator.scenario import load as load_scenario

CALLS = 20000
TRIALS = 5


@dataclass(frozen=True)
class Entry:
    simulated_us: float  # per call into the simulator, outside its own timing
    c_us: float  # per call into C of the same shape

    @property
    def excess_us(self) -> float:
        return max(self.simulated_us - self.c_us, 0.0)

    @property
    def excess_seconds(self) -> float:
        return self.excess_us / 1e6


@functools.cache
def entry() -> Entry:
    sim = SimulatedNvml(load_scenario("dgx-h100"))
    sim.clock.set_speed(0)
    sim.library.nvmlInitWithFlags(0)
    out = ctypes.c_uint()
    handle = ctypes.c_void_p(sim.handle_of(sim.devices[0]))
    simulated = sim.library.nvmlDeviceGetClockInfo
    clock, pointer = ctypes.c_uint(pynvml.NVML_CLOCK_SM), ctypes.byref(out)
    memcmp, nothing = ctypes.CDLL(None).memcmp, ctypes.c_size_t(0)
    simulated_us, c_us = [], []
    for _ in range(TRIALS + 1):  # the first warms both paths up and is not kept
        inside, started = sim.cpu_seconds, time.thread_time()
        for _ in range(CALLS):
            simulated(handle, clock, pointer)
        simulated_us.append(((time.thread_time() - started) - (sim.cpu_seconds - inside)) / CALLS * 1e6)
        started = time.thread_time()
        for _ in range(CALLS):
            memcmp(handle, pointer, nothing)
        c_us.append((time.thread_time() - started) / CALLS * 1e6)
    return Entry(statistics.median(simulated_us[1:]), statistics.median(c_us[1:]))
