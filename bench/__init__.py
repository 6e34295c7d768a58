"""Benchmarks of the train step, the PyTorch peer, the input pipeline, compile time and the paper's speed table.

Every script prints a table and writes bench/results/<name>.json; the shared plumbing is in bench/common.py.
"""
import os

# Before anything imports torch (flax's dependencies already do): libgomp's default spin-waiting made the 2-thread
# PyTorch peer ~4x slower than 1 thread whenever other processes shared the CPU (tiny256: 3.8 s vs 0.87 s per step;
# PASSIVE: 0.92 s). Passive waiting is the peer's best setting on a shared machine; XLA does not use OpenMP.
# Set OMP_WAIT_POLICY yourself to override; the JSON records it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
