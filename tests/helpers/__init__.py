"""What the tests share, in one package (tests/ is on pytest's `pythonpath`: `from helpers import tiny`).

`tiny` builds the tiny random models and holds their corpus, `reference` the naive float64 references every
fast path is checked against; the others are named for what uses them: `audit`, `cli` (a refusal's one
line), `driver` (a `dscore` driver as a subprocess), `full_disk`, `local_cluster`, `maskless`,
`nbest_samples`, `object_store` (moto's S3 server), `pairwise`, `pll`, `rescoring`, `s3_proxy`, `sources`;
`trial` is the adversarial trial that tests/system plays. No test file imports another: what two share
moves here.
"""
