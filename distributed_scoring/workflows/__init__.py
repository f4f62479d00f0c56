"""Commands built from workloads: what runs on the driver before and after the shard pipeline.

`score` (with `chain`: `--method chain`, and `maskless`: `--maskless`, `--method unmasked`), `rescore/`,
`audit/`, `joints`, `infill`, `sample`, `generate`, `train/` (Ray Train: `pmlm`, `maskless`), and the
commands over finished folders and jobs: `verify`, `submit`.
"""
