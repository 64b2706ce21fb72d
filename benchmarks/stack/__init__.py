"""Benchmark a deployed stack by URL: `python -m benchmarks.stack --help` (README.md beside this file)."""
