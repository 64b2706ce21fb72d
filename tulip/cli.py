"""`tulip serve [flags]`: run one replica. Every flag is also a TULIP_* environment variable.
`tulip health [flags]`: ask a replica's grpc.health.v1 service whether it serves (container health checks).

Exit codes of `serve`: 0 after a clean shutdown (SIGTERM/SIGINT, all accepted work answered), 1 when the
model fails to load or verify, or shutdown timed out with work unanswered; 2 when the address cannot be bound; 3
after a batch left the device unable to run work (tulip.device_check: the replica refused new work, answered what
it held UNAVAILABLE "device_lost" and drained; a restart, a new CUDA context, is what serves again).
Exit codes of `health`: 0 when the answer is SERVING; 1 for anything else (NOT_SERVING while loading or
draining, unknown service, nothing listening, no answer within the timeout), with one line saying which.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from protos.exit_status import DEVICE_LOST_EXIT
from rose import log_format
from rose.flags import add_config_arguments, config_from_args
from tulip.config import ENV_PREFIX, TulipConfig

T = TypeVar("T")

log = logging.getLogger("tulip")
HEALTH_ENV_PREFIX = "TULIP_HEALTH"
_WILDCARD_HOSTS = {"", "0.0.0.0", "::", "[::]"}


@dataclass(frozen=True)
class HealthCheckConfig:
    """`tulip health`'s flags (TULIP_HEALTH_* variables). The default address follows the replica's own
    TULIP_HOST / TULIP_PORT, so the image's HEALTHCHECK needs no flags wherever the port is moved."""

    address: str = field(default="", metadata={
        "help": "host:port of the replica; empty = TULIP_HOST (127.0.0.1 when unset or a wildcard) and "
                "TULIP_PORT (50051 when unset)"})
    timeout_s: float = field(default=2.0, metadata={"help": "seconds to wait for the answer before exit 1"})
    service: str = field(default="", metadata={
        "help": "service whose status is asked: empty = the whole server, or tulip.v1.Embedder"})

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")


def default_health_address(environ: Mapping[str, str]) -> str:
    """Where a replica started with `environ` listens, seen from inside its own container or host."""
    host = environ.get(f"{ENV_PREFIX}_HOST") or "127.0.0.1"  # an empty variable counts as unset
    if host in _WILDCARD_HOSTS:
        host = "127.0.0.1"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 literal
    return f"{host}:{environ.get(f'{ENV_PREFIX}_PORT') or TulipConfig.port}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tulip", description="Tulip: the FCFS gRPC batcher in front of one ROSE engine (one per GPU).")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser(
        "serve", help="serve one model over gRPC (Embed, Info, grpc.health.v1)",
        description="Serve one model over gRPC. Every flag is also an environment variable "
                    f"({ENV_PREFIX}_<FLAG>); flags win over the environment.")
    add_config_arguments(serve, TulipConfig, ENV_PREFIX)
    health = commands.add_parser(
        "health", help="check a replica's grpc.health.v1 status: exit 0 when SERVING, 1 otherwise",
        description="Ask a running replica's standard gRPC health service whether it serves (what container "
                    "health checks run). Exit 0 when SERVING, 1 otherwise, with one line saying why. Every flag "
                    f"is also an environment variable ({HEALTH_ENV_PREFIX}_<FLAG>); flags win.")
    add_config_arguments(health, HealthCheckConfig, HEALTH_ENV_PREFIX)
    return parser


def check_health(config: HealthCheckConfig, environ: Mapping[str, str] | None = None) -> tuple[bool, str]:
    """One Check RPC: (serving, one-line description). Fails fast when nothing listens (UNAVAILABLE)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    address = config.address or default_health_address(os.environ if environ is None else environ)
    service = config.service or "(server)"
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=config.service), timeout=config.timeout_s)
        except grpc.RpcError as exc:
            details = " ".join(str(exc.details() or "").split())[:200]  # type: ignore[union-attr]
            return False, f"{address} {service}: {exc.code().name}: {details}"  # type: ignore[union-attr]
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, f"{address} {service}: {status}"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "health":
        try:
            health = config_from_args(HealthCheckConfig, args, HEALTH_ENV_PREFIX)
        except ValueError as exc:
            print(f"tulip health: invalid configuration: {exc}", file=sys.stderr)
            return 2
        serving, line = check_health(health)
        print(f"tulip health: {line}", file=sys.stdout if serving else sys.stderr)
        return 0 if serving else 1
    try:
        config = config_from_args(TulipConfig, args, ENV_PREFIX)
    except ValueError as exc:  # __post_init__ range checks
        print(f"tulip: invalid configuration: {exc}", file=sys.stderr)
        return 2
    log_format.setup(config.log_level, config.log_format, "tulip")
    compile_kernels_early(config)
    return run_loop(serve(config), config.event_loop)


def compile_kernels_early(config: TulipConfig) -> None:
    """ROSE's Triton kernels of the model's manifest start compiling in worker processes now, before this
    process spends seconds importing torch and the engine (rose.kernel_ahead; the engine adopts them). Only for
    ROSE with a model folder and a manifest, on a host whose GPUs the driver names; a failure only logs: the
    engine's own start tries again."""
    if not config.model or config.engine_factory or config.device == "cpu":
        return
    try:
        from rose import kernel_ahead
        from rose.kernel_manifest import is_off

        if is_off(config.kernel_manifest):
            return
        target = kernel_ahead.driver_target()
        if target is not None:
            kernel_ahead.start_early(config.model, target, config.kernel_manifest)
    except Exception:  # noqa: BLE001
        log.warning("could not start compiling the kernel manifest early", exc_info=True)


def run_loop(main: Coroutine[Any, Any, T], kind: str) -> T:
    """asyncio.run, on uvloop when asked for or (auto) installed: grpc.aio supports it, and its loop
    hand-offs (call_soon_threadsafe from the completer) are cheaper."""
    if kind != "asyncio":
        try:
            import uvloop
        except ImportError:
            if kind == "uvloop":
                raise SystemExit("tulip: --event-loop uvloop needs the uvloop package") from None
        else:  # a Runner with uvloop's factory, not uvloop.run (absent before uvloop 0.18)
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                return runner.run(main)
    return asyncio.run(main)


async def serve(config: TulipConfig) -> int:
    from tulip.server import TulipServer

    server = TulipServer(config)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _on_signal, sig, stop)
    try:
        await server.start_listening()
    except Exception as exc:  # noqa: BLE001 - port taken, bad host, metrics port taken
        log.error("cannot listen on %s:%d: %s", config.host, config.port, exc)
        return 2
    loading = asyncio.ensure_future(server.load())
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if not loading.done():
        log.info("shutdown requested while loading")
        loading.cancel()
        await server.stop()
        return 0
    if loading.exception() is not None:
        exc = loading.exception()
        log.error("model failed to load or verify: %s: %s", type(exc).__name__, exc,
                  exc_info=(type(exc), exc, exc.__traceback__))
        stopping.cancel()
        await server.stop()
        return 1
    lost = asyncio.ensure_future(server.lost_device.wait())
    await asyncio.wait({stopping, lost}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    lost.cancel()
    drained = await server.drain()
    if server.device_lost is not None:  # tulip.device_check: a restart (a new CUDA context) is what can serve
        log.critical("exiting with status %d: the device was lost (%s)", DEVICE_LOST_EXIT, server.device_lost)
        return DEVICE_LOST_EXIT
    return 0 if drained else 1


def _on_signal(sig: signal.Signals, stop: asyncio.Event) -> None:
    # A repeated signal is ignored: Ctrl-C under `ivy up` delivers SIGINT to the whole process group
    # and the parent's SIGTERM right after; the drain is bounded by shutdown_timeout_s anyway.
    if stop.is_set():
        return
    log.info("received %s: draining", sig.name)
    stop.set()
