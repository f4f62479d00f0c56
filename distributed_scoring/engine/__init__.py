"""Engines: torch code that turns token ids into log-probabilities, and trains the models that do
(model loading, the one packer, masking, PLL, chain-rule scoring, causal LM, conditionals, joints,
infilling, MH sampling, maskless one-pass scoring, training), with their torch-free settings and sums
(`model_files`, `joint_stats`, `sampler_settings`). No pyarrow, no storage, no runs: imported on the
actors that score and the workers that train.
"""
