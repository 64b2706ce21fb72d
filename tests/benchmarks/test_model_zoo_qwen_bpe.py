"""The benchmark zoo's Qwen3 folder with `--tokenizer qwen-bpe` (a Qwen3-style byte-level BPE trained on the
corpus), built here at a fraction of its width: the reference's tokenizer (transformers) and Ivy's
(rose.tokenizer) give the same ids, EOS last, through the word cache; the folder embeds as
sentence-transformers does; two builds are the same bytes."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import model_zoo
from benchmarks.stack.corpus import Corpus, documents
from benchmarks.stack.verify import default_probes
from rose.spec import load_spec
from rose.tokenizer import Tokenizer

SMALL = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 16, "intermediate_size": 128, "vocab_size": 16000}  # the BPE's 15 244 ids fit


@pytest.fixture(scope="module")
def bpe_folder(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(model_zoo.QWEN3_CONFIGS, "qwen3-0.6b", {**model_zoo.QWEN3_CONFIGS["qwen3-0.6b"], **SMALL})
        return model_zoo.make_folder("qwen3-0.6b", tmp_path_factory.mktemp("zoo") / "qwen3-0.6b-bpe", "float32",
                                     tokenizer="qwen-bpe")


def _texts(folder) -> list[str]:
    """The reference's probes (what benchmarks.stack.reference embeds) and corpus documents as the stack cuts them."""
    return [*default_probes(), *documents(folder, 6, seed=3), *Corpus.load().paragraphs[:20]]


def test_the_reference_and_ivy_tokenize_alike_through_the_word_cache(bpe_folder) -> None:
    transformers = pytest.importorskip("transformers")
    spec = load_spec(bpe_folder)
    assert (spec.family, spec.pooling, spec.normalize) == ("qwen3", "last", True)
    ivy, plain = Tokenizer(spec), Tokenizer(spec, cache_words=0)
    reference = transformers.AutoTokenizer.from_pretrained(str(bpe_folder), local_files_only=True)
    assert isinstance(reference, transformers.PreTrainedTokenizerFast)  # the class the config names
    eos = ivy.token_id(model_zoo.QWEN_EOS)
    assert reference.eos_token_id == reference.pad_token_id == eos
    cache = ivy.word_cache
    assert cache is not None and plain.word_cache is None  # the byte-level BPE path is taken, not refused
    texts = _texts(bpe_folder)
    ours = [ivy.encode(t).ids for t in texts]  # one text a call, as Ivy tokenizes inline: words learned
    assert ours == [e.ids for e in plain.encode_batch(texts)] == reference(texts)["input_ids"]
    assert all(ids[-1] == eos and eos not in ids[:-1] for ids in ours)
    learned, new = len(cache), cache.new
    assert [ivy.encode(t).ids for t in texts] == ours
    assert learned > 500 and cache.new - new < new / 4  # the second time, words are found in the cache
    words = [len(t.split()) for t in texts]
    assert sum(map(len, ours)) < 2 * sum(words)  # ordinary words are whole tokens, not bytes


def test_the_folder_embeds_as_sentence_transformers_does(bpe_folder) -> None:
    st = pytest.importorskip("sentence_transformers")
    import torch

    from rose.engine import Engine

    texts = _texts(bpe_folder)[:12]
    engine = Engine.from_pretrained(bpe_folder, device="cpu")
    try:
        ids = [e.ids for e in Tokenizer(engine.spec).encode_batch(texts)]
        ours = engine.embed([np.asarray(i, dtype=np.int32) for i in ids])
    finally:
        engine.close()
    ref = st.SentenceTransformer(str(bpe_folder), device="cpu").encode(texts, convert_to_tensor=True)
    sims = torch.nn.functional.cosine_similarity(ref.double(), torch.as_tensor(ours).double(), dim=1)
    assert float(sims.min()) >= 0.9999


def test_two_builds_are_the_same_bytes(tmp_path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        model_zoo.write_tokenizer(tmp_path / name, "qwen-bpe", 32768, 151669)
    for file in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes()


def test_only_qwen3_and_decoder_folders_take_the_bpe(tmp_path) -> None:
    with pytest.raises(ValueError, match="only for"):
        model_zoo.make_folder("minilm-l6", tmp_path / "m", "float32", tokenizer="qwen-bpe")


def test_ivy_text_path_makes_its_documents_with_the_served_tokenizer(bpe_folder, capsys) -> None:
    """benchmarks.ivy_text_path --model a BPE folder: documents of exactly --tokens by that folder's tokenizer
    (they were cut by MiniLM's, and its own length check failed), both variants answered."""
    import asyncio

    from benchmarks import ivy_text_path

    loop = asyncio.new_event_loop()  # the Gateway's gRPC channels want a current loop, whatever ran before
    asyncio.set_event_loop(loop)
    try:
        _, gateway = ivy_text_path.build_app(str(bpe_folder))
    finally:
        asyncio.set_event_loop(None)
        loop.close()
    chosen = ivy_text_path.variants(gateway, count=3, tokens=96, model=str(bpe_folder))
    assert set(chosen) == {"text", "text-pool", "ids"} and all(len(v.requests) == 3 for v in chosen.values())
    assert ivy_text_path.main(["--model", str(bpe_folder), "--tokens", "96", "--rounds", "1",
                               "--per-round", "6"]) == 0
    assert "text - ids" in capsys.readouterr().out


def test_tokenize_parallel_cuts_a_text_the_word_cache_takes_whole(bpe_folder) -> None:
    """benchmarks.tokenize_parallel on a BPE folder: the pieces' variants exist though the word cache would take the
    text whole (they were None, and the run failed), every variant's ids equal the plain path's (checked inside),
    and tokenizers' own encode is timed beside the cache's."""
    from benchmarks import tokenize_parallel

    result = tokenize_parallel.run(bpe_folder, [1, 2], runs=1)
    rows = result["texts"]["4096 tokens"]["results"]
    assert {"plain", "no cache", "serial x2", "pool 2", "rust 2"} <= set(rows)
    assert result["texts"]["4096 tokens"]["tokens"] == 4096
