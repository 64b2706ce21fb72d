"""`ivy index INPUT OUTPUT`: flags from IndexConfig (IVY_INDEX_* variables too), the job, the summary.

Exit status: 0 when the whole input is in OUTPUT (embedded or in rejects.jsonl), 1 when the job could not start
(server unreachable, an option refused) or stopped (a fatal server error, --fail-fast), 130 on Ctrl-C; the
committed shards stay and `--resume` continues from them. A resumed run's summary.json counts the whole output;
resuming a complete one leaves it as it is.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from ivy.index.config import ENV_PREFIX, IndexConfig
from rose import log_format
from rose.flags import add_config_arguments, config_from_args
from rose.host_cpus import usable_cpus

log = logging.getLogger("ivy.index")


def add_parser(commands) -> None:
    index = commands.add_parser(
        "index", help="embed a corpus (JSONL, CSV, Parquet, a folder of text files) into Parquet shards",
        description="Embed a corpus through a deployed server (--url) or in-process (--model DIR) into a folder of "
                    "Parquet shards (id, embedding), resumable with --resume after a kill. Every flag is also an "
                    f"environment variable ({ENV_PREFIX}_<FLAG>); flags win.")
    index.add_argument("input", metavar="INPUT",
                       help="a .jsonl, .json (an array), .csv/.tsv or .parquet file, or a folder of text files")
    index.add_argument("output", metavar="OUTPUT", help="the folder of shards (created; --resume to continue one)")
    add_config_arguments(index, IndexConfig, ENV_PREFIX)


def make_embedder(config: IndexConfig):
    from ivy.index.pipeline import request_options

    options = request_options(config)
    if config.url:
        from ivy.index.client import HttpEmbedder

        return HttpEmbedder(config.url, api_key=config.api_key, model_name=config.model_name, options=options,
                            encoding=config.encoding, timeout_s=config.timeout_s, retries=config.retries)
    from ivy.index.local import LocalEmbedder

    return LocalEmbedder(config.model, options=options, encoding=config.encoding, device=config.device,
                         dtype=config.dtype, threads=min(config.concurrency, usable_cpus()))


def run_index(args: argparse.Namespace) -> int:
    from ivy.index.client import FatalError
    from ivy.index.pipeline import Job
    from ivy.index.progress import print_summary

    config = config_from_args(IndexConfig, {k: v for k, v in vars(args).items() if k not in ("input", "output")},
                              ENV_PREFIX)
    log_format.setup(config.log_level, config.log_format, "ivy-index")
    source = Path(args.input)
    if not source.exists():
        raise SystemExit(f"ivy index: {source} does not exist")
    embedder = job = None
    try:
        embedder = make_embedder(config)
        job = Job(config, source, Path(args.output), embedder)
        progress = job.run()
    except FatalError as exc:
        print(f"ivy index: {exc}" if job is None else  # before any shard: nothing to resume
              f"ivy index: stopped: {exc}; committed shards are kept, --resume continues", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("ivy index: interrupted" + ("; committed shards are kept, --resume continues" if job else ""),
              file=sys.stderr)
        return 130
    finally:
        if embedder is not None:
            embedder.close()  # also stops workers still retrying, so the interpreter's exit need not wait
    if progress is None:  # complete already: its summary.json stays as the run that finished it wrote it
        return 0
    summary = progress.summary(config.gpu_hour_price, config.gpus)
    print_summary(summary)
    (Path(args.output) / "summary.json").write_text(json.dumps(summary, indent=1))
    return 0
