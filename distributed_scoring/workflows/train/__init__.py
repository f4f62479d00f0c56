"""`dscore train`: training jobs on Ray Train (`pmlm`: continued u-PMLM training of a masked LM; `maskless`:
a student that predicts a teacher's PLLs in one forward pass), each writing a model folder that
`dscore score` loads."""
