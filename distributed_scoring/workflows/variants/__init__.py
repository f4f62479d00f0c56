"""`dscore variants`: variant effects of deep mutational scans by the four strategies of Meier et al. (2021)."""
