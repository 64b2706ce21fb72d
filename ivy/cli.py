"""`ivy serve` (the gateway) and `ivy up` (the whole local stack in one command).

Every flag is also an environment variable (IVY_<FLAG> for the gateway's, IVY_UP_<FLAG> for `ivy up`'s own);
flags win over the environment. `--help` on each command lists them with their variable and default.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from typing import Sequence

from ivy.config import ENV_PREFIX, IvyConfig
from rose import log_format
from rose.flags import add_config_arguments, config_from_args, config_to_env


def build_parser() -> argparse.ArgumentParser:
    from ivy.up import UP_ENV_PREFIX, UpConfig

    parser = argparse.ArgumentParser(prog="ivy", description="Ivy: the HTTP gateway of the Ivy -> Tulip -> ROSE "
                                     "embedding stack.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser(
        "serve", help="run the HTTP gateway in front of running Tulip replicas",
        description="Run the HTTP gateway (OpenAI/Perplexity/Cohere-compatible routes) in front of Tulip replicas. "
                    f"Every flag is also an environment variable ({ENV_PREFIX}_<FLAG>); flags win.")
    add_config_arguments(serve, IvyConfig, ENV_PREFIX)
    up = commands.add_parser(
        "up", help="start Tulip (one per GPU, or one on a CPU) and the gateway; stop both on Ctrl-C",
        description="The local stack in one command: starts `tulip serve` child processes and the gateway with the "
                    "same model, waits until both are ready, prints the URL and a curl example, and stops both on "
                    f"Ctrl-C or SIGTERM. Gateway flags are {ENV_PREFIX}_<FLAG> variables (--replicas is set by "
                    f"`ivy up` itself); `ivy up`'s own are {UP_ENV_PREFIX}_<FLAG>; TULIP_* variables reach the "
                    "Tulip processes unchanged (their --model, --port and device are set per replica).")
    add_config_arguments(up, IvyConfig, ENV_PREFIX, exclude=frozenset({"replicas", "replicas_dns"}))
    add_config_arguments(up, UpConfig, UP_ENV_PREFIX)
    from ivy.index.cli import add_parser as add_index_parser

    add_index_parser(commands)
    return parser


def setup_logging(config: IvyConfig) -> None:
    """This process's logs in config.log_format, each JSON line with the request id being served."""
    from ivy.request_trace import REQUEST_ID

    log_format.setup(config.log_level, config.log_format, "ivy", lambda: {"request_id": REQUEST_ID.get()},
                     access_log=config.access_log)


def serve(config: IvyConfig) -> int:
    """Run uvicorn: one process in-line, or N workers that rebuild the config from IVY_* variables."""
    import uvicorn

    setup_logging(config)
    from ivy.connections import protocol_class

    # uvicorn's protocol with header size and read-timeout limits and a connection cap (ivy/connections.py).
    common = dict(host=config.host, port=config.port, log_level=config.log_level.lower(),
                  access_log=config.access_log, log_config=None, http=protocol_class(),
                  timeout_keep_alive=config.keep_alive_timeout_s,
                  h11_max_incomplete_event_size=config.max_header_bytes)
    if config.workers == 1:
        from ivy.app import create_app

        uvicorn.run(create_app(config), **common)
        return 0
    os.environ.update(config_to_env(config, ENV_PREFIX))
    own_dir = None
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        own_dir = tempfile.mkdtemp(prefix="ivy-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = own_dir  # /metrics aggregates every worker
    try:
        uvicorn.run("ivy.app:app_from_env", factory=True, workers=config.workers, **common)
    finally:
        if own_dir:
            shutil.rmtree(own_dir, ignore_errors=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "index":
        from ivy.index.cli import run_index

        return run_index(args)
    config = config_from_args(IvyConfig, args, ENV_PREFIX)
    if args.command == "serve":
        return serve(config)
    from ivy.up import UP_ENV_PREFIX, UpConfig, run_stack

    setup_logging(config)
    return run_stack(config, config_from_args(UpConfig, args, UP_ENV_PREFIX))


if __name__ == "__main__":
    raise SystemExit(main())
