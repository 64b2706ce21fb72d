"""GTE v1.5 and NomicBERT at their published widths, for `benchmarks.rose_gpu` (ROSE rows only).

transformers has no class for either: their Hugging Face code is remote code (`trust_remote_code`), which is
not downloaded here, so there is no HF baseline to run beside ROSE. The folders come from the test suite's
builders (tests/rose/rose_tiny_remote.py and rose_tiny_nomic.py: the published config layout and tensor
names, random weights, a WordPiece tokenizer and the sentence-transformers files) with the published widths
of gte-base-en-v1.5 and nomic-embed-text-v1.5. Weights are written in float32; ROSE casts them at load.
"""

from __future__ import annotations

import sys
from pathlib import Path

TESTS_ROSE = Path(__file__).resolve().parents[1] / "tests" / "rose"

REMOTE_MODELS = {  # name: (builder family, published widths over the builder's tiny config)
    "gte-base-en-v1.5": ("gte", dict(vocab_size=30528, hidden_size=768, num_hidden_layers=12,
                                     num_attention_heads=12, intermediate_size=3072, max_position_embeddings=8192,
                                     rope_theta=500000.0)),
    "nomic-embed-text-v1.5": ("nomic", dict(vocab_size=30528, n_embd=768, n_layer=12, n_head=12, n_inner=3072,
                                            n_positions=8192)),
}


def make_remote_folder(name: str, out: Path, dtype: str = "bfloat16", seed: int = 0) -> Path:
    """The folder of REMOTE_MODELS[name] at `out` (dtype: accepted for make_folder's signature; float32)."""
    return build_remote_model(name, out, seed).path


def build_remote_model(name: str, out: Path, seed: int = 0):
    """The test suite's TinyModel of REMOTE_MODELS[name] at `out`: its folder and its reference module."""
    family, widths = REMOTE_MODELS[name]
    if str(TESTS_ROSE) not in sys.path:
        sys.path.insert(0, str(TESTS_ROSE))
    if family == "gte":
        from rose_tiny_remote import build_gte

        return build_gte(out.parent, name=out.name, seed=31 + seed, std=0.02, **widths)
    from rose_tiny_nomic import build_nomic

    return build_nomic(out.parent, name=out.name, seed=41 + seed, **widths)
