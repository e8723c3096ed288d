"""The `metrics_profile` an instance runs with: which metrics it sends, decided here once, and consulted
by submission (what to send) and by collection (what not to read: a read that gives only metrics the
profile does not send is not made)."""

from typing import FrozenSet

from gpu_monitoring.metrics.spec import DEFAULT_PROFILE, PROFILES, sent_in


class Profile:
    """One of PROFILES. Health, service checks and events are the same in every profile: they judge
    only metrics of the smallest profile, or reads that give one of those too, so never what a
    profile skips."""

    __slots__ = ("name", "sent", "sent_parts")

    def __init__(self, name: str = DEFAULT_PROFILE) -> None:
        if name not in PROFILES:
            raise ValueError(f"unknown metrics_profile {name!r}: one of {', '.join(PROFILES)}")
        self.name = name
        self.sent: FrozenSet[str] = sent_in(name)
        # A part's series (one NVLink link's) may belong to a larger profile than the GPU's own.
        self.sent_parts: FrozenSet[str] = sent_in(name, parts=True)

    def sends(self, metric: str) -> bool:
        """Whether the profile sends the metric's series of a GPU (or of the node, a workload...)."""
        return metric in self.sent

    def sends_part(self, metric: str) -> bool:
        """Whether the profile sends the metric's series of a part of a GPU (tagged with the part)."""
        return metric in self.sent_parts

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Profile) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"Profile({self.name!r})"


# An instance's profile where metrics_profile is not set.
DEFAULT = Profile(DEFAULT_PROFILE)
# What a reader serving every profile reads (a sidecar: each check it serves chooses its own).
EVERYTHING = Profile(PROFILES[-1])
