"""Tulip: the first-come-first-served gRPC batcher that drives ROSE (one process per GPU).

Layout: config (flags), request (wire -> sequences), scheduler (FCFS token-budget queue), worker (two
batches in flight on the engine), job (one call's rows and result), server (grpc.aio: Embed, Info,
health, drain), metrics (Prometheus), engine_loader (factory, device, warm-up), cli (`tulip serve`).
"""

from tulip.version import __version__

__all__ = ["__version__"]
