"""`tulip serve [flags]`: run one replica. Every flag is also a TULIP_* environment variable.

Exit codes: 0 after a clean shutdown (SIGTERM/SIGINT, all accepted work answered), 1 when the model fails
to load or verify, or shutdown timed out with work unanswered; 2 when the address cannot be bound.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from rose.flags import add_config_arguments, config_from_args
from tulip.config import ENV_PREFIX, TulipConfig

log = logging.getLogger("tulip")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tulip", description="Tulip: the FCFS gRPC batcher in front of one ROSE engine (one per GPU).")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser(
        "serve", help="serve one model over gRPC (Embed, Info, grpc.health.v1)",
        description="Serve one model over gRPC. Every flag is also an environment variable "
                    f"({ENV_PREFIX}_<FLAG>); flags win over the environment.")
    add_config_arguments(serve, TulipConfig, ENV_PREFIX)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(TulipConfig, args, ENV_PREFIX)
    except ValueError as exc:  # __post_init__ range checks
        print(f"tulip: invalid configuration: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=config.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(serve(config))


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
    await stopping
    return 0 if await server.drain() else 1


def _on_signal(sig: signal.Signals, stop: asyncio.Event) -> None:
    # A repeated signal is ignored: Ctrl-C under `ivy up` delivers SIGINT to the whole process group
    # and the parent's SIGTERM right after; the drain is bounded by shutdown_timeout_s anyway.
    if stop.is_set():
        return
    log.info("received %s: draining", sig.name)
    stop.set()
