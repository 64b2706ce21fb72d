"""Benchmarks: the executable spec of speed.

`benchmarks.stack` measures a deployed stack (ours or a peer speaking `/v1/embeddings`) by URL with the
seed's four suites; results and plots go to `benchmarks/results/`.
"""
