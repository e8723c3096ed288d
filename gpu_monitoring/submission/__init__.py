"""Snapshot and attribution to Datadog: metrics by the spec's types, health, XIDs, workloads, fleet, cost.

This layer never calls NVML; it reads the Snapshot and what attribution and health made of it. `submitter`
orders a run's submission; each kind of series has its module (`node`, `inventory`, `events`), tags theirs
(`tags`), and every series reaches the Agent through `metric_sink`.
"""
