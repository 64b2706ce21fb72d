"""`ivy index`'s configuration: one frozen dataclass, every field a `--flag` and an `IVY_INDEX_*` variable."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rose.log_format import FORMATS as LOG_FORMATS

ENV_PREFIX = "IVY_INDEX"
ENCODINGS = ("float", "base64_int8", "base64_binary")
FORMATS = ("auto", "jsonl", "json", "csv", "parquet", "text")


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass(frozen=True)
class IndexConfig:
    url: str = field(default="", metadata=_help(
        "Base URL of a deployed /v1/embeddings server (ours or any OpenAI-compatible one); empty = --model."))
    api_key: str = field(default="", metadata=_help("Bearer token sent to --url."))
    model: str = field(default="", metadata=_help(
        "In-process: a model folder run here with rose.Engine (GPU when present); 'bundled' = all-MiniLM-L6-v2."))
    model_name: str = field(default="", metadata=_help(
        "`model` sent to --url; empty = the first model its GET /v1/models lists."))
    format: str = field(default="auto", metadata=_help(
        "Input format: auto (by extension; a folder = text files; a .json file = json when it starts with '[', "
        "else jsonl), jsonl, json (one array of records, read whole), csv, parquet or text."))
    id_field: str = field(default="id", metadata=_help(
        "Field (column) holding each document's id; absent = line/row number, or the file's relative path."))
    text_field: str = field(default="text", metadata=_help("Field (column) holding each document's text."))
    encoding: str = field(default="float", metadata=_help(
        "Output: float (fixed-size list of float32), base64_int8 or base64_binary (the encoding's bytes)."))
    dimensions: int = field(default=0, metadata=_help("Matryoshka width (re-normalized); 0 = the model's."))
    normalize: bool | None = field(default=None, metadata=_help("L2-normalize; unset = the model's default."))
    truncate: bool = field(default=False, metadata=_help(
        "Cut over-long documents; false = they go to rejects.jsonl."))
    truncation_side: str = field(default="right", metadata=_help("right or left."))
    input_type: str = field(default="", metadata=_help("query or document templating; empty = none."))
    prompt_name: str = field(default="", metadata=_help("A sentence-transformers prompt of the model."))
    batch_size: int = field(default=64, metadata=_help("Documents per request (per engine call in-process)."))
    concurrency: int = field(default=8, metadata=_help("Requests kept in flight (threads)."))
    sort_window: int = field(default=10000, metadata=_help(
        "Documents per window (and per shard): each window is sorted by length before batching."))
    resume: bool = field(default=False, metadata=_help(
        "Continue a killed run in OUTPUT from its last committed shard (same input and options)."))
    fail_fast: bool = field(default=False, metadata=_help("Stop at the first bad document instead of rejecting it."))
    retries: int = field(default=5, metadata=_help("Retries of a request that failed for the server's reasons."))
    timeout_s: float = field(default=300.0, metadata=_help("Seconds one request may take."))
    progress: str = field(default="auto", metadata=_help(
        "auto (a bar on a terminal, log lines otherwise), bar, log or off."))
    log_interval_s: float = field(default=10.0, metadata=_help("Seconds between progress log lines."))
    gpu_hour_price: float = field(default=3.5, metadata=_help("Price of one GPU hour, for the summary's cost."))
    gpus: int = field(default=1, metadata=_help("GPUs the run occupies (the price is multiplied by it)."))
    device: str = field(default="", metadata=_help("In-process device: cpu, cuda, cuda:N; empty = auto."))
    dtype: str = field(default="", metadata=_help("In-process dtype: float32, bfloat16; empty = auto."))
    log_level: str = field(default="info", metadata=_help("Log level: debug, info, warning, error."))
    log_format: str = field(default="text", metadata=_help("text, or json (one object a line, for a log pipeline)."))

    def __post_init__(self) -> None:
        if self.log_format not in LOG_FORMATS:
            raise SystemExit(f"ivy index: --log-format must be one of {', '.join(LOG_FORMATS)}, not {self.log_format!r}")
        if bool(self.url) == bool(self.model):
            raise SystemExit("ivy index: give exactly one of --url (a server) or --model (in-process)")
        if self.encoding not in ENCODINGS:
            raise SystemExit(f"ivy index: --encoding must be one of {', '.join(ENCODINGS)}")
        if self.format not in FORMATS:
            raise SystemExit(f"ivy index: --format must be one of {', '.join(FORMATS)}")
        for name in ("batch_size", "concurrency", "sort_window", "gpus"):
            if getattr(self, name) < 1:
                raise SystemExit(f"ivy index: --{name.replace('_', '-')} must be at least 1")
        for name in ("timeout_s", "log_interval_s", "gpu_hour_price"):  # NaN passes every check below
            if not math.isfinite(getattr(self, name)) or getattr(self, name) < 0:
                raise SystemExit(f"ivy index: --{name.replace('_', '-')} must be a finite number, 0 or more, "
                                 f"not {getattr(self, name)}")
        if self.dimensions < 0 or self.retries < 0 or self.timeout_s <= 0:
            raise SystemExit("ivy index: --dimensions and --retries must be >= 0, --timeout-s positive")
        if self.truncation_side not in ("right", "left"):
            raise SystemExit("ivy index: --truncation-side must be right or left")
        if self.input_type not in ("", "query", "document", "search_query", "search_document", "passage"):
            raise SystemExit("ivy index: --input-type must be query or document")
        if self.progress not in ("auto", "bar", "log", "off"):
            raise SystemExit("ivy index: --progress must be auto, bar, log or off")

    def options(self) -> dict:
        """What decides the output's values and layout: a resumed run must have the same."""
        return {"encoding": self.encoding, "dimensions": self.dimensions, "normalize": self.normalize,
                "truncate": self.truncate, "truncation_side": self.truncation_side, "input_type": self.input_type,
                "prompt_name": self.prompt_name, "id_field": self.id_field, "text_field": self.text_field,
                "format": self.format, "sort_window": self.sort_window}
