"""DCGM's profiling activity from the node's dcgm-exporter, for GPUs GPM does not measure (before
Hopper, A100/A30 MIG instances): found (discovery), read (client), parsed (exposition), judged
(freshness) and put into the snapshot (join) by one reader a run (reader)."""
