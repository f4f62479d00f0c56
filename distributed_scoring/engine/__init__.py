"""Engines: torch code that turns token ids into log-probabilities (models, the one packer, masking,
PLL, causal LM, conditionals, joints, infilling, MH sampling). No pyarrow, no storage, no runs:
imported on the actors that score.
"""
