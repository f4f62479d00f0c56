"""`dscore rescore`: N-best lists rescored with a masked LM (and a causal LM), weights tuned on dev."""
