"""`rose`: inspect and try a model folder with the engine in-process.

    rose info MODEL_DIR                 the EngineInfo as JSON
    rose embed MODEL_DIR "text" ...     embeddings as JSON (default options of the model)

Engine options are flags and ROSE_* environment variables (rose.flags). Issue 4 adds `rose smoke`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from rose.flags import add_config_arguments, config_from_args

PREFIX = "ROSE"


@dataclass(frozen=True)
class EngineConfig:
    device: str | None = field(default=None, metadata={"help": "cpu, cuda or cuda:N; empty = CUDA when available"})
    dtype: str | None = field(default=None, metadata={"help": "float32, bfloat16 or float16; empty = float32 on CPU, bfloat16 on CUDA"})
    attention: str = field(default="auto", metadata={"help": "attention backend: auto, sdpa or varlen"})
    pinned_cap_bytes: int = field(default=256 << 20, metadata={"help": "cap on page-locked output buffers, bytes"})
    pinned_timeout_s: float = field(default=30.0, metadata={"help": "seconds a step waits at the pinned cap before failing"})
    model_id: str | None = field(default=None, metadata={"help": "model name to report; empty = the folder's"})


def load_engine(model_dir: str, cfg: EngineConfig):
    from rose.engine import Engine

    return Engine.from_pretrained(model_dir, **dataclasses.asdict(cfg))


def cmd_info(args: argparse.Namespace, cfg: EngineConfig) -> int:
    engine = load_engine(args.model_dir, cfg)
    print(json.dumps(dataclasses.asdict(engine.info), indent=2))
    engine.close()
    return 0


def cmd_embed(args: argparse.Namespace, cfg: EngineConfig) -> int:
    from rose.head import OutputOptions

    engine = load_engine(args.model_dir, cfg)
    texts = list(args.texts) or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if not texts:
        print("rose embed: no texts given", file=sys.stderr)
        return 2
    if args.prompt_name:
        if args.prompt_name not in engine.spec.prompts:
            print(f"rose embed: unknown prompt {args.prompt_name!r}; the model has {sorted(engine.spec.prompts)}",
                  file=sys.stderr)
            return 2
        texts = [engine.spec.prompts[args.prompt_name] + t for t in texts]
    encoded = engine.tokenizer.encode_batch(texts)
    normalize = None if args.normalize is None else args.normalize == "true"
    vectors = engine.embed([e.ids for e in encoded], options=OutputOptions(dimensions=args.dimensions, normalize=normalize))
    for text, enc, vec in zip(texts, encoded, vectors):
        print(json.dumps({"text": text, "tokens": len(enc.ids), "embedding": [round(float(x), 6) for x in vec]}))
    engine.close()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rose", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="print the engine info of a model folder")
    info.add_argument("model_dir")
    info.set_defaults(func=cmd_info)
    embed = sub.add_parser("embed", help="embed texts (arguments, or stdin lines) and print JSON lines")
    embed.add_argument("model_dir")
    embed.add_argument("texts", nargs="*")
    embed.add_argument("--dimensions", type=int, default=0, help="Matryoshka truncation; 0 = full width")
    embed.add_argument("--normalize", choices=("true", "false"), default=None, help="default: the model's")
    embed.add_argument("--prompt-name", default=None, help="prepend this sentence-transformers prompt")
    embed.set_defaults(func=cmd_embed)
    for p in (info, embed):
        add_config_arguments(p, EngineConfig, PREFIX)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = config_from_args(EngineConfig, args, PREFIX)
    try:
        return args.func(args, cfg)
    except (ValueError, RuntimeError) as exc:  # ModelFolderError, BatchError, backend errors: one line
        print(f"rose {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
