"""Tulip's gRPC channel options: the server's (from TulipConfig) and the ones its clients should mirror.

The server sets: max send/receive message = max_message_mb; keepalive ping every keepalive_time_s;
keepalive_permit_without_calls=1; and it tolerates client pings without data every
min_client_ping_interval_s (10 s) or slower; faster ones earn ping strikes and, after two, a GOAWAY
"too_many_pings". Clients (Ivy) should use CLIENT_CHANNEL_OPTIONS below (mirror them; Ivy does not import
tulip): a 30 s keepalive is 3x the server's floor.
"""

from __future__ import annotations

from tulip.config import TulipConfig

MIB = 1024 * 1024

CLIENT_CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_send_message_length", 16 * MIB),  # = the server's max_message_mb (default 16)
    ("grpc.max_receive_message_length", 16 * MIB),
    ("grpc.keepalive_time_ms", 30_000),  # >= the server's min_client_ping_interval_s (10 s)
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),  # the server permits pings without calls too
    ("grpc.http2.max_pings_without_data", 0),  # keep pinging idle channels
]


def server_options(config: TulipConfig) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.max_send_message_length", config.max_message_bytes),
        ("grpc.keepalive_time_ms", int(config.keepalive_time_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(config.keepalive_timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", int(config.min_client_ping_interval_s * 1000)),
        ("grpc.http2.max_ping_strikes", 2),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.so_reuseport", 0),  # a second replica on the same port must fail to bind, not share it
    ]
