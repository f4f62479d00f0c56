"""The adversarial trial: an operator who feeds `dscore` bad inputs, kills it, damages its folders, makes
every operator mistake docs/runs.md refuses and tries a few attacks, one case at a time, against the real
CLI (docs/reliability.md).

`dscore` runs the commands (forked, spawned or inline), `judge` reads what they did and checks it, `cases`
holds what a case is and the inputs cases write, one module per category holds its cases (`bad_inputs`,
`faults`, `mistakes`, `attacks`, `stops`), `play` plays them and `report` writes the table. The system
tests of tests/system play each case as a test; tests/system/trial.py plays them all and writes the page.
"""
