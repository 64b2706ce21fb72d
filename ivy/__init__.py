"""Ivy: the HTTP gateway of the Ivy -> Tulip -> ROSE embedding stack.

Parses and validates requests (OpenAI, Perplexity, Cohere/Jina shapes), templates and tokenizes off the
event loop, splits large requests into chunks and spreads them over Tulip replicas by gRPC, and answers
in the client's API shape. Imports no torch: the gateway's image carries none.
"""

__version__ = "0.1.0"
