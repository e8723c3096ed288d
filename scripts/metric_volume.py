"""Series per GPU that each `metrics_profile` sends on every simulated scenario, and the node's
InfiniBand/RoCE port series, counted per node: the README's "Metric volume" table.

    python scripts/metric_volume.py     # print the markdown table

Every series is a custom metric. A scenario's series per GPU are the distinct (metric, tags)
series of its second run (the first has no rates nor GPM yet), the node's own series included,
divided by the GPUs NVML sees; a port's series (metrics.yaml scope `port`) grow with the node's
network ports, not its GPUs, and are counted per node apart. Each scenario runs with its defaults
(its pods and prices) and the profile; the scenarios are those of the package's scenarios directory.
"""

import os
import sys
from dataclasses import dataclass
from typing import Dict, FrozenSet, Tuple

# gRPC's C core logs every simulated pod-resources channel it closes; set before grpc loads.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

from datadog_checks.base.stubs import aggregator  # noqa: E402

from gpu_monitoring.check import GpuMonitoringCheck  # noqa: E402
from gpu_monitoring.metrics.spec import NAMESPACE, PROFILES, SPEC  # noqa: E402
from gpu_monitoring.simulator.scenario import available  # noqa: E402

RUNS = 2
INTERVAL = 15
DEVICES = "gpu_monitoring.devices.count"


@dataclass(frozen=True)
class Volume:
    """What one scenario's last run sent with one profile."""

    gpus: int
    series: FrozenSet[Tuple[str, Tuple[str, ...]]]
    service_checks: FrozenSet[tuple]
    events: Tuple[tuple, ...]  # everything but when

    @property
    def per_gpu(self) -> float:
        return sum(not _per_port(name) for name, _ in self.series) / self.gpus

    @property
    def port_series(self) -> int:
        """The node's network port series, whatever its GPUs."""
        return sum(_per_port(name) for name, _ in self.series)


def _per_port(name: str) -> bool:
    return SPEC[name[len(NAMESPACE) + 1:]].scope == "port"


def measure(scenario: str, profile: str, runs: int = RUNS) -> Volume:
    """What the last of `runs` runs, one interval apart, sent."""
    check = GpuMonitoringCheck("gpu_monitoring", {}, [{"simulate": scenario, "metrics_profile": profile}])
    # Each instance its own ID, as the Agent gives it: what one keeps in the persistent cache (held
    # verdicts, resets counted toward escalation) is not another's.
    check.check_id = f"{scenario}:{profile}"
    check.simulated_node.nvml.clock.set_speed(0)
    try:
        for run in range(runs):
            if run:
                check.simulated_node.nvml.advance(INTERVAL)
            aggregator.reset()
            error = check.run()
            if error:
                raise RuntimeError(f"{scenario} with metrics_profile {profile}: {error}")
        return _volume()
    finally:
        check.cancel()
        aggregator.reset()


def _volume() -> Volume:
    stubs = [stub for name in aggregator.metric_names for stub in aggregator.metrics(name)]
    (gpus,) = {int(stub.value) for stub in stubs if stub.name == DEVICES}
    checks = [stub for name in list(aggregator._service_checks) for stub in aggregator.service_checks(name)]
    return Volume(
        gpus=gpus,
        series=frozenset((stub.name, tuple(sorted(stub.tags))) for stub in stubs),
        service_checks=frozenset((c.name, c.status, tuple(sorted(c.tags)), c.message) for c in checks),
        # An event's timestamp is the wall clock of the run that drained it: two runs can differ there.
        events=tuple(tuple(sorted((k, str(v)) for k, v in event.items() if k != "timestamp"))
                     for event in aggregator.events),
    )


def volumes() -> Dict[str, Dict[str, Volume]]:
    """{scenario: {profile: Volume}} for every scenario and profile."""
    return {scenario: {profile: measure(scenario, profile) for profile in PROFILES} for scenario in available()}


def table(measured: Dict[str, Dict[str, Volume]]) -> str:
    """The markdown table: a row per scenario, its GPUs and its series per GPU in each profile, then
    its network port series per node in each profile."""
    lines = [
        "| scenario | GPUs | " + " | ".join(f"`{profile}`" for profile in PROFILES)
        + " | port series per node (" + " / ".join(PROFILES) + ") |",
        "|---|---:|" + "---:|" * (len(PROFILES) + 1),
    ]
    for scenario, by_profile in measured.items():
        gpus = next(iter(by_profile.values())).gpus
        cells = [f"{by_profile[profile].per_gpu:.1f}" for profile in PROFILES]
        ports = " / ".join(str(by_profile[profile].port_series) for profile in PROFILES)
        lines.append(f"| `{scenario}` | {gpus} | " + " | ".join(cells) + f" | {ports} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    sys.stdout.write(table(volumes()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
