"""One module per workload: its options dataclass (what changes its rows), its output schema and its
prepare and score stages. Engines are imported inside the stages, on the actors, never on the driver.
"""
