"""Which batches the persistent decoder (rose.layers.persistent_decoder) takes: the persistent_decoder setting
(EngineConfig, TulipConfig, ROSE_PERSISTENT_DECODER) read into a token bound, and the bounds measured per family
and per layer shape. No torch here: the configs check the setting when they are made."""

from __future__ import annotations

import os

MAX_TOKENS = 128
ON = -1  # routed_tokens("on"): attach routes the family's ROUTED_TOKENS
# ROSE_PERSISTENT_DECODER=on: the largest batch routed to it, by family, up to where it beat the layers through the
# engine on the H200 (11c8496, host to host: Qwen3-0.6B -9 to -15 % at 16-128 tokens; all-MiniLM -21 % at 16, level
# at 32, +15 % at 64 and +39 % at 128)
ROUTED_TOKENS = {"decoder": 128, "encoder": 16}
AUTO = -2  # routed_tokens("auto"): attach routes MEASURED's bound for the model's shape, else nothing
# ROSE_PERSISTENT_DECODER=auto: (family, heads, kv heads, head dim, hidden, inner) -> the bound where the kernel beat
# the layers through the engine on the H200 (11c8496): Qwen3-0.6B's and all-MiniLM-L6's layer shapes; a shape not
# measured takes the layers (Qwen3-4B's wider GEMM phases may want other tiles)
MEASURED = {("decoder", 16, 8, 128, 1024, 3072): 128, ("encoder", 12, 12, 32, 384, 1536): 16}
DEFAULT_ROUTING = "auto"  # EngineConfig's, TulipConfig's and the library's (ROSE_PERSISTENT_DECODER unset)


def routed_tokens(raw: str | None) -> int:
    """The persistent_decoder setting (EngineConfig, TulipConfig; None: the ROSE_PERSISTENT_DECODER variable) ->
    the largest batch in tokens routed to it: off (0, false, "") -> 0, on (1, true) -> ON (the family's
    ROUTED_TOKENS, chosen by attach), auto (the default) -> AUTO (MEASURED's bound for the model's shape, else
    off), or a number of tokens from 2 to MAX_TOKENS."""
    if raw is None:
        raw = os.environ.get("ROSE_PERSISTENT_DECODER") or DEFAULT_ROUTING  # empty: unset, as the configs read it
    raw = raw.strip().lower()
    if raw in ("", "0", "off", "false", "no"):
        return 0
    if raw in ("1", "on", "true", "yes"):
        return ON
    if raw == "auto":
        return AUTO
    if raw.isdigit() and 2 <= int(raw) <= MAX_TOKENS:
        return int(raw)
    raise ValueError(f"persistent_decoder {raw!r}: expected off, on, auto or a token count of 2 to {MAX_TOKENS}")
