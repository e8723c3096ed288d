"""The queries of the dashboards and monitors in assets/, against what the check really sends.

- Every metric they query is in metadata.csv, is aggregated the way its type needs, and is really
  sent in the metrics_profile the assets work in.
- Every tag key they filter or group on is one the check really submits on that series (found by
  running the check on the simulated scenarios), or one the Agent adds; every tag value they
  filter on is one the check sends.
"""

import csv

from gpu_monitoring.health import xid
from gpu_monitoring.metrics.spec import SPEC, sent_in

from .assets_support import (
    ASSETS_PROFILE,
    NAMESPACE,
    ROOT,
    SERVICE_CHECKS,
    TEMPLATE_VARIABLES,
    _all_refs,
    emitted,
    metric_tag_keys,
    part_tag_keys,
    reads_parts,
)

# Fixtures: pytest finds them among this module's names; listed so that linters see them used.
__all__ = ["emitted", "metric_tag_keys", "part_tag_keys"]

METADATA = {row["metric_name"]: row for row in csv.DictReader((ROOT / "metadata.csv").read_text().splitlines())}

# Gauges in these units make no sense summed across series (a sum of temperatures or of
# utilization percentages of different GPUs)...
NOT_SUMMABLE_UNITS = {"percent", "degree celsius"}
# ...except these, where the sum has a meaning of its own.
SUMMABLE_PERCENTS = {
    # SM percent of the device used by each container: summed over the containers of a namespace
    # or of a shared GPU, /100 gives busy GPU-equivalents (the device's SM use for a shared GPU).
    "gpu_monitoring.workload.sm_utilization",
}


def test_the_scenarios_show_every_scope_and_service_check(emitted):
    scopes = {SPEC[name[len(NAMESPACE):]].scope for name in emitted.metrics}
    assert scopes == {SPEC[name].scope for name in sent_in(ASSETS_PROFILE)}
    assert {"pod_name", "kube_namespace", "xid_action"} <= emitted.metrics[NAMESPACE + "xid_errors"]
    assert {"gpu_parent_uuid", "gpu_mig_profile"} <= emitted.metrics[NAMESPACE + "memory.used"]
    # The values of the Agent's own gpu check, so one filter selects the same GPUs in both.
    assert emitted.values["gpu_slicing_mode"] == {"none", "mig", "mig-parent"}
    assert emitted.values["gpu_sharing_mode"] == {"none", "time_slicing", "mps"}
    assert set(emitted.service_checks) == set(SERVICE_CHECKS)


def test_every_metric_exists_in_metadata():
    for where, ref, _, _ in _all_refs():
        assert ref.metric in METADATA, f"{where}: {ref.metric} is not in metadata.csv"


def test_a_query_of_a_metric_with_series_per_part_says_which_it_reads():
    """A GPU's total and its parts' series (one per NVLink link) share a name: a query that neither
    reads the parts (`nvlink_port:*`, by nvlink_port) nor leaves them out (`!nvlink_port:*`) would add
    the total to its links wherever the profile sends both."""
    for where, ref, _, _ in _all_refs():
        tag = SPEC[ref.metric[len(NAMESPACE):]].part_tag
        if tag:
            assert reads_parts(ref) or tag in ref.excluded, f"{where}: {ref.metric} needs {tag}:* or !{tag}:*"


def test_every_metric_is_sent_in_the_assets_profile(emitted):
    for where, ref, _, _ in _all_refs():
        assert ref.metric in emitted.metrics, f"{where}: no scenario sends {ref.metric} with {ASSETS_PROFILE}"


def test_aggregation_fits_the_metric_type():
    for where, ref, scalar, time_aggregation in _all_refs():
        row = METADATA[ref.metric]
        assert ref.space in ("avg", "sum", "min", "max"), f"{where}: {ref.metric} aggregated with {ref.space}"
        as_count = {"as_count", "as_rate"} & set(ref.functions)
        if row["metric_type"] == "count":
            # A count holds the increase per interval: summed across series, queried as a count or a rate.
            assert ref.space == "sum", f"{where}: count {ref.metric} aggregated with {ref.space}"
            assert as_count, f"{where}: count {ref.metric} without .as_count() or .as_rate()"
            if "as_count" in ref.functions:
                assert scalar in ("", "sum"), f"{where}: count {ref.metric} reduced with {scalar}, not sum"
                assert time_aggregation in (None, "sum"), f"{where}: count {ref.metric} over {time_aggregation}"
        else:
            assert row["metric_type"] == "gauge", ref.metric
            assert not as_count, f"{where}: gauge {ref.metric} queried {as_count}"
            # A sum over time of a gauge's points depends on how often it was sampled.
            assert scalar != "sum", f"{where}: gauge {ref.metric} reduced over time with sum"
            assert time_aggregation != "sum", f"{where}: gauge {ref.metric} summed over the monitor's window"
            if row["unit_name"] in NOT_SUMMABLE_UNITS and ref.metric not in SUMMABLE_PERCENTS:
                assert ref.space != "sum", f"{where}: {ref.metric} ({row['unit_name']}) summed across series"


def test_every_tag_key_is_one_the_check_submits(metric_tag_keys):
    for where, ref, _, _ in _all_refs():
        allowed = metric_tag_keys[ref.metric]
        for key in ref.filter_keys | set(ref.by):
            assert key in allowed, f"{where}: {ref.metric} has no tag {key} (it has {sorted(allowed)})"
        for variable in ref.variables:
            assert variable in TEMPLATE_VARIABLES, f"{where}: unknown template variable ${variable}"
            assert TEMPLATE_VARIABLES[variable] in allowed, f"{where}: ${variable} does not apply to {ref.metric}"


def test_filtered_tag_values_are_ones_the_check_submits(emitted):
    known = {
        "xid_action": set(xid.ADVICE),
        "xid_origin": {x.origin for x in xid.CATALOG.values()} | {"unknown"},
        "xid": {str(code) for code in xid.CATALOG},
        "gpu_slicing_mode": emitted.values["gpu_slicing_mode"],
        "gpu_sharing_mode": emitted.values["gpu_sharing_mode"],
    }
    for where, ref, _, _ in _all_refs():
        for key, values in ref.filter_values.items():
            if key in known:
                assert values <= known[key], f"{where}: {key} has no value {sorted(values - known[key])}"
