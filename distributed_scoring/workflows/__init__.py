"""Commands built from workloads (`dscore score`, `rescore`, `audit`, `joints`, `verify`): what runs on
the driver before and after the shard pipeline.
"""
