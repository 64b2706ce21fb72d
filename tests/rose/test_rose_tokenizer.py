"""ROSE's tokenizer wrapper against `tokenizers` itself: ids with special tokens, truncation from either
side keeping the specials, exact original lengths (the fast path without offsets must change nothing)."""

from __future__ import annotations

from tokenizers import Tokenizer as HFTokenizer

from rose.spec import bundled_model_dir, load_spec
from rose.tokenizer import Tokenizer

TEXTS = ["hello world", "Ünïcødé, emoji 🚀 and accents: café, naïve, 東京.", "", "word " * 300,
         "The quick brown fox jumps over the lazy dog. " * 20]


def test_ids_and_truncation_match_the_reference_tokenizer() -> None:
    spec = load_spec(bundled_model_dir())
    ours = Tokenizer(spec)
    ref = HFTokenizer.from_file(str(spec.model_dir / "tokenizer.json"))
    ref.no_padding()
    ref.no_truncation()
    for text in TEXTS:
        full = ref.encode(text).ids  # [CLS] ... [SEP]
        got = ours.encode(text, max_length=10**6)
        assert got.ids == full and got.original_length == len(full) and not got.truncated
        for side in ("right", "left"):
            cut = ours.encode(text, max_length=12, side=side)
            body = full[1:-1][:10] if side == "right" else full[1:-1][-10:]
            expected = [full[0], *body, full[-1]] if len(full) > 12 else full
            assert cut.ids == expected and cut.truncated == (len(full) > 12), (text[:20], side)
    assert ours.count_tokens(TEXTS) == [len(ref.encode(t).ids) for t in TEXTS]
