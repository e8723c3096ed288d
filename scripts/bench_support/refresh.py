"""What a run costs when its Kubernetes caches are due: the kubelet's pods and pod-resources'
answer are kept `pod_cache_ttl` seconds (30 by default), so at the Agent's 15-second interval
every other run asks both again. Section 2's steady runs ask neither; here a check with
`pod_cache_ttl: 0` asks both every run, interleaved with the floor as in section 2, and the two
are averaged at the share of runs that refresh."""

from dataclasses import dataclass

from gpu_monitoring.kube import DEFAULT_TTL

from .floor import FloorComparison, compare
from .harness import INTERVAL, per
from .report import Table

# Of the runs at the Agent's interval, those whose caches are due.
REFRESHING_SHARE = min(INTERVAL / DEFAULT_TTL, 1.0)


@dataclass
class RefreshCost:
    steady: FloorComparison
    refreshing: FloorComparison

    @property
    def extra_floors(self) -> float:
        """What asking adds to a run, per series, in floors: each comparison against its own floor,
        so that a drift of the machine between the two does not pass for a cost."""
        return self.refreshing.ratio_own - self.steady.ratio_own

    @property
    def extra_ms(self) -> float:
        """The same in ms of the steady comparison's floor."""
        return self.extra_floors * per(self.steady.floor_ms, self.steady.floor_series) * self.steady.series

    @property
    def amortized_ratio(self) -> float:
        return self.steady.ratio_own + REFRESHING_SHARE * self.extra_floors


def measure(steady: FloorComparison, scenario: str, rounds: int) -> RefreshCost:
    return RefreshCost(steady, compare(scenario, rounds, pod_cache_ttl=0))


def table(scenario: str, cost: RefreshCost) -> Table:
    steady, refreshing = cost.steady, cost.refreshing
    return Table(
        f"Runs whose Kubernetes caches are due ({scenario}): the kubelet's /pods and pod-resources asked",
        ["run", "floor ms", "check own ms", "own/floor per series"],
        [["steady (the headline above)", steady.floor_ms, steady.own_ms, steady.ratio_own],
         ["asking the kubelet and pod-resources", refreshing.floor_ms, refreshing.own_ms, refreshing.ratio_own],
         [f"average at a {INTERVAL} s interval and the default {DEFAULT_TTL:g} s pod_cache_ttl "
          f"({REFRESHING_SHARE:.0%} of runs ask)", "", "", cost.amortized_ratio]],
        [f"a run that asks adds {cost.extra_floors:.2f} floors per series, {cost.extra_ms:.2f} ms at the steady "
         "comparison's floor; no target is set on it (the target is the steady run's)"],
    )
