"""`ivy up`'s checks: before start-up, that every port is free and ours alone; during it, readiness probes.

A port another stack holds would otherwise let `ivy up` report that stack's readiness as its own; ready
means every Tulip answers grpc.health.v1 SERVING (_tulip_serving) and the gateway's /ready is 200
(_ivy_ready, which also names a replica refused for serving another model).
"""

from __future__ import annotations

import json
import os
import socket
import urllib.error
import urllib.request

from ivy.config import IvyConfig


def _port_free(host: str, port: int) -> bool:
    host = (host or "0.0.0.0").strip("[]")
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except OSError:
        return True  # cannot tell: let Tulip try, and report its own error
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Tulip's metrics server binds:
        try:  # a port in TIME_WAIT from an earlier run is free to it
            probe.bind(address)
        except OSError:
            return False
    return True


def _taken_port(config: IvyConfig, tulip_ports: list[int]) -> str:
    """Why the gateway's or a Tulip's port cannot be ours ("" when all are free): in use by another process
    (another stack's Tulip or gateway would answer our readiness checks), or given to two of ours."""
    tulip_host = os.environ.get("TULIP_HOST", "127.0.0.1")
    wanted = [(config.host, config.port, "the gateway (--port)")]
    wanted += [(tulip_host, p, f"Tulip replica {k} (--tulip-port)") for k, p in enumerate(tulip_ports)]
    seen: dict[int, str] = {}
    for host, port, what in wanted:
        if port in seen:
            return f"port {port} is given to both {seen[port]} and {what}"
        seen[port] = what
        if not _port_free(host, port):
            return (f"port {port}, for {what}: address already in use on {host or '0.0.0.0'} (another stack or "
                    f"program holds it)")
    return ""


def _tulip_connect_host() -> str:
    host = os.environ.get("TULIP_HOST", "127.0.0.1")
    return "127.0.0.1" if host in ("", "0.0.0.0", "::", "[::]") else host


def _tulip_serving(address: str) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def _ivy_ready(url: str) -> tuple[bool, str]:
    """(ready, why a replica can never be used: its model_mismatch detail, else "")."""
    try:
        with urllib.request.urlopen(f"{url}/ready", timeout=5.0) as response:  # it probes replicas: 2 x 2 s
            return response.status == 200, ""
    except urllib.error.HTTPError as exc:
        try:
            replicas = json.loads(exc.read()).get("replicas", [])
        except (ValueError, AttributeError, OSError):
            return False, ""
        details = [f"{r.get('address')}: {r.get('detail', '')}" for r in replicas
                   if isinstance(r, dict) and r.get("state") == "model_mismatch"]
        return False, "; ".join(details)
    except (urllib.error.URLError, OSError):
        return False, ""
