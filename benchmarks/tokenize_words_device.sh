#!/usr/bin/env bash
# The word cache on the H200 host's CPU: benchmarks.tokenize_words on MiniLM's WordPiece tokenizer (benchmarks/assets/minilm-l6): `tokenizers`, the ascii path, the cache warm, cold and cold in one group, and the corpus at first sight (~10 s; no GPU, no wheels).
set -u
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh" || exit 1
python3 -m benchmarks.tokenize_words --model-dir benchmarks/assets/minilm-l6 --json "$OUT/tokenize_words_h200.json"
