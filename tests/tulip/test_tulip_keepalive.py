"""Idle channels are not closed with GOAWAY "too_many_pings" when the client pings no faster than the
server's floor (RELIABILITY #23). Scaled down from production (client 30 s, server floor 10 s) to
seconds; the mismatched pairing shows the check can fail."""

import time

import grpc
import pytest
from tulip_testkit import (
    FakeEngine,
    ServerThread,
    encode_request,
    make_config,
    wait_until,
)

from protos import embed_pb2_grpc
from tulip.config import TulipConfig
from tulip.server import CLIENT_CHANNEL_OPTIONS

CLIENT_PING_MS = 1000


def client_options() -> list[tuple[str, int]]:
    scaled = dict(CLIENT_CHANNEL_OPTIONS)
    # The production pairing keeps the same margin: client interval >= 3x the server's floor.
    assert scaled["grpc.keepalive_time_ms"] >= 3 * 1000 * TulipConfig().min_client_ping_interval_s
    scaled["grpc.keepalive_time_ms"] = CLIENT_PING_MS
    return list(scaled.items())


def idle_channel_states(server_floor_s: float, idle_s: float | None) -> list:
    with ServerThread(make_config(min_client_ping_interval_s=server_floor_s), FakeEngine()) as s:
        channel = grpc.insecure_channel(s.address, options=client_options())
        states: list = []
        channel.subscribe(states.append, try_to_connect=True)
        stub = embed_pb2_grpc.EmbedderStub(channel)
        stub.Embed(encode_request([[1, 2]]), timeout=10)
        wait_until(lambda: grpc.ChannelConnectivity.READY in states)
        if idle_s is None:  # expect GOAWAY: the channel drops back to IDLE
            wait_until(lambda: states[-1] != grpc.ChannelConnectivity.READY, timeout=20, what="GOAWAY")
        else:
            time.sleep(idle_s)  # an idle window with several keepalive pings in it
        stub.Embed(encode_request([[1, 2]]), timeout=10)
        if idle_s is None:  # connectivity callbacks arrive on another thread: let the reconnect's READY land
            wait_until(lambda: states.count(grpc.ChannelConnectivity.READY) >= 2, timeout=10, what="READY again")
        channel.close()
        return list(states)


@pytest.mark.slow
def test_recommended_pairing_keeps_idle_channel_open() -> None:
    states = idle_channel_states(server_floor_s=CLIENT_PING_MS / 3000, idle_s=4 * CLIENT_PING_MS / 1000)
    assert states.count(grpc.ChannelConnectivity.READY) == 1 and grpc.ChannelConnectivity.IDLE not in states[1:]


@pytest.mark.slow
def test_client_pinging_faster_than_the_floor_gets_goaway() -> None:
    states = idle_channel_states(server_floor_s=10.0, idle_s=None)
    assert states.count(grpc.ChannelConnectivity.READY) == 2  # reconnected after the GOAWAY
