"""Running any workload over sharded inputs: the `Workload` contract (and what a workload declares about
itself), in-process and Ray Data execution, resource sizing, progress, and the driver-side no-loss check
and summary. It names no workload.
"""
