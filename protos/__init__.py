"""The internal gRPC contract (embed.proto) and its generated stubs.

Regenerate the stubs with the pinned grpcio-tools (see pyproject's dev extra): ``python -m protos.generate``.
tests/test_protos.py fails when the committed stubs drift from embed.proto.
"""
