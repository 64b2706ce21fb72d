"""ROSE's public facade: load a model folder, step ragged batches, embed token-id lists.

    engine = Engine.from_pretrained("/models/all-MiniLM-L6-v2")      # device and dtype chosen for you
    engine.warmup()                          # a server's start: prewarm graphs checked, the persistent decoder on
    ids = [e.ids for e in engine.tokenizer.encode_batch(["hello", "world"])]
    vectors = engine.embed(ids)                                       # float32 [2, 384], as sentence-transformers
    # a cross-encoder (reranker) folder: one relevance score per (query, document) pair, as CrossEncoder.predict
    pairs = engine.tokenizer.encode_pairs([("a query", "a document")])
    scores = engine.embed([p.ids for p in pairs], token_types=[p.type_ids for p in pairs])   # float32 [1, 1]
    # a classifier (num_labels >= 2): its logits, [n, labels]; rose.head.label_scores gives the probabilities
    lazy = engine.step(rose.Batch.from_sequences(ids))               # native rows, async on a GPU
    rows = lazy.result()

Everything device-side lives in rose.runner.ModelRunner; this file only wires and documents.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from rose import kernel_ahead
from rose.batch import Batch
from rose.devices import device_runs, prepare_probe, resolve_device, resolve_dtype
from rose.head import OutputOptions, apply_head
from rose.kernel_cache import use_kernel_cache
from rose.kernel_manifest import Recorder
from rose.graphs import probe_batch
from rose.persistent_routing import routed_tokens
from rose.lazy import LazyTensor, PinnedPool
from rose.runner import ModelRunner
from rose.retrieval_head import attach_retrieval_heads
from rose.score_head import attach_score_head
from rose.st_head import attach_dense
from rose.spec import EngineInfo  # noqa: F401 (re-exported)
from rose.spec import ModelSpec, default_manifest_path, find_output, load_spec
from rose.tokenizer import Tokenizer
from rose.buckets import DEFAULT_SEQ_BUCKETS, DEFAULT_TOKEN_BUCKETS
from rose.warmup import (DEFAULT_PREWARM, MANIFEST_NAME, VerifiedLayout, prewarm_and_verify, prewarm_chains,
                         prewarm_shapes)

EMBED_CHUNK_TOKENS = 8192  # embed() splits bigger inputs into steps of about this many tokens

log = logging.getLogger("rose.engine")


class Engine:
    # warmup() also captures the layer chains of the bulk layouts the graph manifest names (rose.warmup.prewarm_chains):
    # only for a caller that steps bulk by layers (Tulip with TULIP_BULK_LAYERS_AHEAD > 0 sets it before warmup)
    prewarm_layer_chains = False

    def __init__(self, spec: ModelSpec, tokenizer: Tokenizer, runner: ModelRunner) -> None:
        self.spec = spec
        self.tokenizer = tokenizer
        self._runner = runner
        self.info = EngineInfo(
            model_id=spec.model_id, family=spec.family, max_length=spec.max_length,
            dimensions=spec.dimensions, pooling=spec.pooling, tokenizer_fingerprint=tokenizer.fingerprint,
            native_int8=spec.native_int8, normalize_default=spec.normalize,
            attention_backend=runner.backend.name, device=str(runner.device),
            dtype=str(runner.dtype).removeprefix("torch."), tasks=spec.tasks,
            type_vocab_size=spec.type_vocab_size, outputs=spec.outputs)

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, device: str | torch.device | None = None,
                        dtype: str | torch.dtype | None = None, attention: str = "auto",
                        pinned_cap_bytes: int = 256 << 20, pinned_timeout_s: float = 30.0,
                        model_id: str | None = None, cuda_graphs: bool | None = None,
                        token_buckets: Sequence[int] = DEFAULT_TOKEN_BUCKETS,
                        seq_buckets: Sequence[int] = DEFAULT_SEQ_BUCKETS,
                        prewarm: Sequence[tuple[int, int]] = DEFAULT_PREWARM,
                        graph_manifest: str | Path | None = "auto", express_tokens: int = 0,
                        kernel_manifest: str | None = "auto", persistent_decoder: str | None = None) -> Engine:
        """Load a Hugging Face model folder. device None = CUDA when available; dtype None = float32 on
        a CPU, bfloat16 on CUDA; attention "auto" = the winners per token bucket in the model's serving
        profile (rose_profile.json beside it, written by benchmarks.attention_ab) when present, else ROSE's
        Triton kernel on CUDA (half precision) where it runs the model's attention, else torch varlen, else SDPA.
        cuda_graphs None = on when the device is CUDA: whole-model graphs per bucket layout, captured
        lazily (2nd occurrence); `prewarm` (tokens, sequences) keys and the manifest's hot layouts are
        captured and verified by warmup(). graph_manifest: "auto" = beside the model, None = off. On CUDA the
        Triton kernel variants the kernel manifest lists ("auto": rose_kernels.json beside the model; a path;
        None = off) compile in worker processes while the weights load, and this start's are recorded there
        (rose.kernel_ahead, rose.kernel_manifest). persistent_decoder: off, on (each family's measured bound: Qwen3
        128 tokens, BERT-style encoders 16), auto (the layer shapes measured faster) or a token bound: small
        batches of a Qwen3 model or a BERT-style encoder run every layer in one persistent kernel
        (rose.layers.persistent_decoder), from warmup() on; None = the ROSE_PERSISTENT_DECODER variable, else auto."""
        use_kernel_cache()  # ROSE_KERNEL_CACHE_DIR: JIT caches (Triton's too) there, before anything compiles
        spec = load_spec(model_dir, model_id)
        dev = resolve_device(device)
        ahead, record_to = kernel_ahead.engine_start(spec.model_dir, dev, kernel_manifest)  # while the weights load
        try:
            tokenizer = Tokenizer(spec)
            pool = PinnedPool(pinned_cap_bytes, pinned_timeout_s, pin=dev.type == "cuda")
            use_graphs = dev.type == "cuda" if cuda_graphs is None else cuda_graphs
            graphs = {"token_buckets": token_buckets, "seq_buckets": seq_buckets} if use_graphs else None
            runner = ModelRunner(spec, dev, resolve_dtype(dtype, dev), attention, pool, graphs,
                                 persistent_tokens=routed_tokens(persistent_decoder))
            attach_dense(runner, spec)  # sentence-transformers Dense modules, inside forward (and its graphs)
            attach_score_head(runner, spec, tokenizer)  # a cross-encoder's classifier / yes-no head, likewise
            attach_retrieval_heads(runner, spec)  # SPLADE's MLM pooling, BGE-M3's ColBERT and sparse heads, likewise
            engine = cls(spec, tokenizer, runner)
            engine.prewarm = tuple(prewarm)
            engine.express = express_tokens > 0 and runner.enable_express(express_tokens)
            engine.graph_manifest = (default_manifest_path(spec.model_dir, MANIFEST_NAME) if graph_manifest == "auto"
                                     else Path(graph_manifest) if graph_manifest else None)
        except BaseException:
            if ahead is not None:
                ahead.cancel()
            raise
        engine.kernel_manifest, engine.kernels_ahead = record_to, ahead
        if record_to is not None:
            Recorder.install()
        return engine

    @property
    def runner(self) -> ModelRunner:
        if self._runner is None:
            raise RuntimeError("engine is closed")
        return self._runner

    express = False  # an express lane (from_pretrained's express_tokens): step(batch, express=True)
    kernel_manifest: Path | None = None  # where the Triton variants this process compiled are recorded
    kernels_ahead: kernel_ahead.CompileWorkers | None = None  # the manifest's variants compiling in workers
    kernels_ahead_report: dict | None = None

    def step(self, batch: Batch, express: bool = False) -> LazyTensor:
        """Native rows float32 [batch.num_rows, dimensions]: pooled hidden states, not normalized (for
        pplx-embed round(127*tanh(x)); for a cross-encoder its score, width 1, then its logit where an
        activation lies between them (spec.outputs); for a classifier its logits, one per label). Returns at
        once on a GPU; waits (or raises PinnedPoolExhausted) while the pinned pool is at its cap. express: on
        the express lane, beside whatever the bulk lane runs (rose.express)."""
        return self.runner.step(batch, express=express)

    def device_ok(self) -> bool:
        """Whether the engine's device still runs work after a batch failed (rose.devices.device_runs): False once
        a CUDA error poisoned the context, which only a new process clears (Tulip then exits: tulip.device_check)."""
        return device_runs(self.runner.device)

    def step_layered(self, batch: Batch, ahead: int) -> LazyTensor:
        """step(batch), one decoder layer at a time (per-layer CUDA graphs on a GPU: rose.layer_graphs), at most
        `ahead` layers on the device ahead of this thread, which is busy until the last is enqueued; another
        thread's step() meanwhile runs between two layers (rose.layer_steps.step_paced). Only where
        `layer_steps` is not 0."""
        from rose.layer_steps import step_paced

        return step_paced(self.runner, batch, ahead)

    @property
    def layer_steps(self) -> int:
        """How many steps step_layered takes per batch (graphs of a chain on a GPU, decoder layers on a CPU); 0 for
        a model that cannot be stepped layer by layer, and on a GPU where its layers would run eagerly (no CUDA
        graphs, or a backend with host plan state such as FlashInfer: rose.layer_graphs), which costs bulk
        3-10 % (`benchmarks/NOTES.md`), so Tulip keeps the express lane there."""
        runner = self.runner
        if not hasattr(runner.model, "forward_layers"):
            return 0
        if not runner.on_cuda:
            return len(runner.model.layers)
        chains = runner.layer_chains()
        return len(chains.chunks) if chains is not None else 0

    def replays(self, batch: Batch) -> bool:
        """Whether step(batch) would replay a captured CUDA graph of the batch's own layout: host work of a
        fraction of a millisecond, no eager run, capture or host sync (what Tulip checks before stepping on
        its event loop). Reads only; False on a CPU, without graphs, and on the express lane's layouts."""
        return self.runner.replays(batch)

    def embed(self, sequences: Sequence[Sequence[int]], pooling: str | None = None,
              spans: Sequence[tuple[int, int, int]] | None = None,
              options: OutputOptions | None = None,
              token_types: Sequence[Sequence[int]] | None = None, output: str | None = None) -> np.ndarray:
        """What sentence-transformers returns for these token ids (pplx-embed: the int8 values as float32;
        a cross-encoder: CrossEncoder.predict's score per pair, [n, 1]; a classifier: its logits, [n, labels]).
        `spans` are (sequence index, start, end) rows instead of one row per sequence; `token_types` one list per
        sequence (BERT pairs). `output`: which of the model's outputs (ModelSpec.outputs: vocab-weights,
        token-vectors, a reranker's logit, ...; default the first)."""
        pooling = pooling or self.spec.pooling
        rows = self._native_rows([list(s) if not isinstance(s, np.ndarray) else s for s in sequences],
                                 pooling, spans, token_types)
        normalize = self.spec.normalize
        if outputs := self.spec.outputs:
            chosen = find_output(outputs, output)
            if chosen is None:
                raise ValueError(f"output {output!r}: the model's are {[o.name for o in outputs]}")
            rows, normalize = rows[:, chosen.start:chosen.start + chosen.width], chosen.normalize
        elif output not in (None, "embed"):
            raise ValueError(f"output {output!r}: the model has one output, 'embed'")
        return apply_head(rows, options or OutputOptions(), native_int8=self.spec.native_int8,
                          default_normalize=normalize)

    def _native_rows(self, sequences: list, pooling: str, spans, token_types=None) -> np.ndarray:
        """Step in chunks of about EMBED_CHUNK_TOKENS tokens; rows come back in input order."""
        all_spans = spans if spans is not None else [(i, None, None) for i in range(len(sequences))]
        out = np.zeros((len(all_spans), self.runner.dimensions), dtype=np.float32)
        by_seq: dict[int, list[int]] = {}
        for row, (seq, _, _) in enumerate(all_spans):
            if not 0 <= seq < len(sequences):
                raise ValueError(f"span {row} names sequence {seq}; there are {len(sequences)}")
            by_seq.setdefault(seq, []).append(row)
        chunks, current, tokens = [], [], 0
        for i, seq in enumerate(sequences):
            if current and tokens + len(seq) > EMBED_CHUNK_TOKENS:
                chunks.append(current)
                current, tokens = [], 0
            current.append(i)
            tokens += len(seq)
        if current:
            chunks.append(current)
        for chunk in chunks:
            local = {seq: j for j, seq in enumerate(chunk)}
            rows = [r for seq in chunk for r in by_seq.get(seq, [])]
            if not rows:
                continue
            types = None if token_types is None else [token_types[i] for i in chunk]
            if spans is None:
                batch = Batch.from_sequences([sequences[i] for i in chunk], pooling, token_types=types)
                rows = list(chunk)
            else:
                batch = Batch.from_sequences([sequences[i] for i in chunk], token_types=types,
                                             spans=[(local[spans[r][0]], spans[r][1], spans[r][2]) for r in rows])
            out[rows] = self.step(batch).result()
        return out

    def warmup(self) -> list[VerifiedLayout]:
        """Run a probe batch end to end, then (with CUDA graphs) capture the prewarm keys and the
        manifest's hot layouts and verify each replay against the eager forward (GraphVerificationError)."""
        self.wait_for_kernels()
        verified = self._warmup()
        self.save_kernel_manifest()
        prepare_probe(self.runner.device)  # device_ok's stream, made while the device runs (rose.devices)
        return verified

    def wait_for_kernels(self) -> dict | None:
        """Join the workers compiling the manifest's variants (their cubins in the cache before the launches that
        load them); their report, also kept in kernels_ahead_report."""
        if self.kernels_ahead is not None:
            self.kernels_ahead_report, self.kernels_ahead = self.kernels_ahead.wait(), None
            log.info("Triton kernels compiled ahead: %s", self.kernels_ahead_report)
        return self.kernels_ahead_report

    def _warmup(self) -> list[VerifiedLayout]:
        self.runner.warm_persistent()  # before any graph holds its layouts' forwards
        n = max(1, min(16, self.spec.max_length))
        probe = [[(7 * i + j) % self.runner.vocab_size for j in range(max(1, n - 3 * i))] for i in range(3)]
        rows = self.step(Batch.from_sequences(probe, self.spec.pooling)).result()
        if not np.isfinite(rows).all():
            raise RuntimeError("warm-up produced non-finite embeddings")
        precompile = getattr(self.runner.model, "precompile_kernels", None)
        if callable(precompile):  # kernel variants that only larger batches use: compiled now, not in serving
            try:
                with torch.inference_mode():
                    precompile()
            except Exception:  # noqa: BLE001 - they would then compile on first use, as before
                log.warning("kernel precompile failed; variants compile on first use", exc_info=True)
        if self.runner.graphs is None:
            return []
        shapes = prewarm_shapes(self.runner, self.prewarm, self.graph_manifest)
        verified = prewarm_and_verify(self.runner, shapes, self.spec.pooling)
        if self.prewarm_layer_chains:
            verified += prewarm_chains(self.runner, self.graph_manifest, self.spec.pooling)
        return verified

    def prewarm_express(self) -> list[VerifiedLayout]:
        """Capture and verify the express lane's graphs (the small prewarm layouts that fit it, rose.express)
        on that lane alone: a caller may run it while the main lane serves (Tulip's express worker does, after
        ready, so the express prewarm is not on the start-up). Raises GraphVerificationError like warmup()."""
        lane = self.runner.express
        if lane is None or lane.graphs is None:
            return []
        shapes = prewarm_shapes(self.runner, self.prewarm, self.graph_manifest)
        return prewarm_and_verify(self.runner, lane.prewarm_shapes(shapes), self.spec.pooling, express=True)

    def capture_pending(self) -> bool:
        """Capture the hottest layout that ran eagerly but has no graph yet, by stepping a probe batch of its
        shape: the capture its next real batch would otherwise pay (~40 ms for the 0.6B on the H200 host).
        For a caller that knows the device is idle (Tulip's worker). False when nothing is pending."""
        graphs = self.runner.graphs
        if graphs is None:
            return False
        for shape in graphs.pending():
            batch = probe_batch(shape, self.runner.vocab_size, self.spec.pooling, seed=0)
            if batch is not None:  # shapes come from real batches, so a probe exists
                self.runner.step(batch, own_layout=True).result()
                return True
        return False

    def save_kernel_manifest(self) -> int:
        """Record the Triton variants compiled so far for the next start (rose.kernel_manifest); how many it
        lists (0: nothing recorded or not written, which only logs)."""
        recorder = Recorder._installed
        try:
            return recorder.save(self.kernel_manifest) if recorder and self.kernel_manifest else 0
        except Exception:  # noqa: BLE001 - the manifest is optional
            log.warning("kernel manifest not recorded", exc_info=True)
            return 0

    def save_graph_manifest(self) -> Path | None:
        """Record the layouts seen in traffic, hottest first, for the next start's prewarm."""
        graphs = self._runner.graphs if self._runner is not None else None
        chains = self._runner._layer_graphs if graphs is not None else None
        if graphs is None or self.graph_manifest is None or not (graphs.seen or (chains and chains.seen)):
            return None
        try:
            graphs.save_manifest(self.graph_manifest, chains.manifest_rows() if chains is not None else None)
        except OSError:
            return None
        return self.graph_manifest

    def stats(self) -> dict:
        r = self.runner
        pool, graphs = r.pool.stats(), r.graphs
        return {"pinned_bytes_in_use": pool["bytes_in_use"], "pinned_bytes_cap": pool["cap_bytes"],
                "pinned_bytes_allocated": pool["bytes_allocated"],
                "graphs_captured": len(graphs.graphs) if graphs else 0,
                "graph_capture_seconds": graphs.capture_seconds if graphs else 0.0,
                "captures_failed": graphs.captures_failed if graphs else 0,
                "graphs_refused": graphs.graphs_refused if graphs else 0,
                "graph_substitutions": sum(graphs.substituted.values()) if graphs else 0,
                "runs": dict(r.runs), "step_seconds_last": r.step_seconds_last,
                "persistent_decoder_tokens": getattr(getattr(r.model, "persistent", None), "routed", 0),
                **(r.express.stats() if r.express is not None else {}),
                **(r._layer_graphs.stats() if r._layer_graphs is not None else {})}

    def close(self) -> None:
        if self.kernels_ahead is not None:  # never warmed up: the workers' results are not needed
            self.kernels_ahead.cancel()
            self.kernels_ahead = None
        if self._runner is not None:
            self.save_graph_manifest()
            self.save_kernel_manifest()
            self._runner.close()
            self._runner = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
