"""`ivy index INPUT OUTPUT`: a corpus in (JSONL, CSV, Parquet or a folder of text files), embeddings out (a folder
of Parquet shards), through any /v1/embeddings server (`--url`) or in-process on this machine (`--model DIR`).

- sources.py: streaming readers; every document gets an input position, an id and its text (or why not).
- pipeline.py: windows of `--sort-window` positions, sorted by length, batched, `--concurrency` in flight;
  one committed shard per window, so a resumed run re-forms exactly the same windows.
- sink.py: shards (temporary name, fsync, os.replace), the manifest (atomically replaced), rejects.jsonl.
- client.py / local.py: the two embedders, one interface (`embed(texts) -> (rows, tokens)`, `RowError`).
- progress.py: a tqdm bar on a terminal, log lines otherwise, and the summary.
"""
