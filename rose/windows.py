"""Sliding-window attention per layer, as transformers reads it from a decoder's config.json (torch-free:
rose.spec records it in the ModelSpec; the model and the attention shape read it from there).

A window is the farthest key, in positions, that a query may attend (on either side; causal attention
still hides the later keys); FULL (-1) means none. transformers states it three ways:
- Qwen2 / Qwen3: `sliding_window` only with `use_sliding_window`, on the layers `layer_types` names
  "sliding_attention" (default: those from `max_window_layers` on); a query sees keys with q - k < window.
- Mistral: `sliding_window` (when set) on every layer, q - k < window.
- Gemma 3: the "sliding_attention" layers of `layer_types` (default: five local layers, then one global);
  causal q - k < window; with `use_bidirectional_attention` (EmbeddingGemma) transformers halves the
  configured window into |q - k| < window // 2 + 1.
A window that no sequence of max_length tokens can exceed masks nothing, and is FULL here, so such layers
take the plain kernels (e5-mistral: a 4096 window over at most 4096 tokens).
"""

from __future__ import annotations

from typing import Any

FULL = -1
SLIDING = "sliding_attention"


def sliding_layers(family: str, config: dict[str, Any]) -> list[bool]:
    """Which layers transformers builds as "sliding_attention" ones (whether or not a window is set)."""
    layers = int(config.get("num_hidden_layers") or 0)
    if family == "mistral":
        return [True] * layers  # MistralModel windows every layer; it ignores layer_types
    if family == "gemma3":
        pattern = int(config.get("sliding_window_pattern") or config.get("_sliding_window_pattern") or 6)
        default = [SLIDING if (i + 1) % pattern else "full_attention" for i in range(layers)]
    else:  # the Qwen families
        start = int(config.get("max_window_layers", 28))  # transformers' default
        default = [SLIDING if i >= start else "full_attention" for i in range(layers)]
    types = list(config.get("layer_types") or default)
    if len(types) != layers:
        raise ValueError(f"layer_types has {len(types)} entries for {layers} layers")
    return [kind == SLIDING for kind in types]


def layer_windows(family: str, config: dict[str, Any], causal: bool, max_length: int) -> tuple[int, ...]:
    """One window per layer (FULL or the farthest visible key); ValueError for a layout ROSE cannot serve."""
    size = config.get("sliding_window")
    if family == "gemma3":
        reach = None if not size else int(size) - 1 if causal else int(size) // 2
    elif family == "mistral":
        reach = None if not size else int(size) - 1
    else:  # the Qwen families
        reach = int(size) - 1 if config.get("use_sliding_window") and size else None
        if reach is not None and not causal:
            raise ValueError("sliding-window attention in a bidirectional Qwen model is not supported")
    sliding = sliding_layers(family, config)
    if reach is None or reach >= max_length - 1:
        return (FULL,) * len(sliding)
    return tuple(reach if local else FULL for local in sliding)
