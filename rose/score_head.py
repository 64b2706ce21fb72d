"""A cross-encoder's score head on the device: pooled rows -> one relevance score per row (rose.cross_spec), or
a sequence classifier's: pooled rows -> one logit per label.

`attach_score_head` makes `ModelRunner.forward` model -> span pooling -> head, so the eager path and every
CUDA graph (captured from `forward`) end in the score; the native row is that score (width 1; 2 with the logit
beside it, below) and the host has nothing left to do. The head runs in float32 on the pooled float32 rows, its
weights read once from the checkpoint (the embedding stack leaves them out):
- classifier (`bert_pooler`, `roberta_head`): dense + tanh on the CLS row, then the projection to 1 label (a
  reranker) or N (a classifier: the logits, its activation left to the client, rose.head.label_scores);
  `distilbert_head`: pre_classifier + ReLU instead of dense + tanh;
- `yes_no`: the final hidden state of the last token against only the two lm_head rows of "yes" and "no"
  (tied models: the embedding table's rows), logit(yes) - logit(no); a [P, 2] product, not [P, vocab].
Then the CrossEncoder activation (Sigmoid by default: sigmoid(yes - no) = softmax over (yes, no) of yes), with
the logit itself in a second column where the activation is not Identity (rose.cross_spec ScoreHead.outputs):
what a client asking for raw scores gets, from the same replay.
"""

from __future__ import annotations

import torch
from torch import nn

from rose.loader import load_tensors
from rose.spec import ModelFolderError, ModelSpec
from rose.st_head import _ACTIVATIONS

_CLASSIFIER_NAMES = {
    "bert_pooler": {"dense.weight": ("pooler.dense.weight",), "dense.bias": ("pooler.dense.bias",),
                    "out.weight": ("classifier.weight",), "out.bias": ("classifier.bias",)},
    "roberta_head": {"dense.weight": ("classifier.dense.weight",), "dense.bias": ("classifier.dense.bias",),
                     "out.weight": ("classifier.out_proj.weight",), "out.bias": ("classifier.out_proj.bias",)},
    "distilbert_head": {"dense.weight": ("pre_classifier.weight",), "dense.bias": ("pre_classifier.bias",),
                        "out.weight": ("classifier.weight",), "out.bias": ("classifier.bias",)},
}


class ClassifierHead(nn.Module):
    """BERT's pooler + classifier, or RoBERTa's classification head: out(tanh(dense(cls))); DistilBERT's
    out(relu(pre_classifier(cls))). `labels` outputs: 1 for a reranker, N for a classifier."""

    def __init__(self, hidden: int, labels: int = 1, relu: bool = False) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, labels)
        self.act = torch.relu if relu else torch.tanh

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.out(self.act(self.dense(pooled)))


class YesNoHead(nn.Module):
    """logit(yes) - logit(no) from the lm_head's two rows: [P, H] @ [H, 2] -> [P, 1]."""

    def __init__(self, rows: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("rows", rows)  # float32 [2, H]: the "yes" row, then the "no" row

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        logits = pooled @ self.rows.t()
        return logits[:, :1] - logits[:, 1:]


class ScoreAndLogit(nn.Sequential):
    """Sequential(head, activation) that keeps the head's [P, 1] logit beside the score: [P, 2]."""

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        logit = self[0](pooled)
        return torch.cat([self[1](logit), logit], dim=1)


def token_id(token: int | str, tokenizer, model_dir) -> int:
    """A LogitScore's id as given, or the tokenizer's id of a token text ("yes", "no")."""
    if isinstance(token, int):
        return token
    found = tokenizer.token_id(token)
    if found is None:
        raise ModelFolderError(f"{model_dir}: the tokenizer has no {token!r} token, which a yes/no reranker scores")
    return int(found)


def build_score_head(spec: ModelSpec, tokenizer) -> nn.Module:
    """The head with its checkpoint weights, float32 on the CPU, eval, with the activation after it (and the
    logit beside the score where ScoreHead.outputs says)."""
    head, hidden = spec.score_head, int(spec.config["hidden_size"])
    if head.kind == "yes_no":
        ids = [token_id(head.true_token, tokenizer, spec.model_dir), token_id(head.false_token, tokenizer, spec.model_dir)]
        names = {"rows": ("lm_head.weight",)}
        if spec.config.get("tie_word_embeddings"):
            names = {"rows": ("lm_head.weight", "embed_tokens.weight")}  # tied checkpoints often omit lm_head
        layer: nn.Module = YesNoHead(load_tensors(spec.model_dir, names, rows={"rows": ids})["rows"].float())
    else:
        tensors = load_tensors(spec.model_dir, _CLASSIFIER_NAMES[head.kind])
        n = len(head.labels) or 1
        layer = ClassifierHead(hidden, n, relu=head.kind == "distilbert_head").to("meta")
        shapes = {"dense.weight": (hidden, hidden), "dense.bias": (hidden,), "out.weight": (n, hidden),
                  "out.bias": (n,)}
        for name, shape in shapes.items():
            if tuple(tensors[name].shape) != shape:
                raise ModelFolderError(f"{spec.model_dir}: classifier tensor {name!r} has shape "
                                       f"{tuple(tensors[name].shape)}, config.json implies {shape}")
        layer.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=True, assign=True)
    activation = _ACTIVATIONS[head.activation]()
    module = (ScoreAndLogit if head.outputs else nn.Sequential)(layer, activation)
    return module.eval().requires_grad_(False)


def attach_score_head(runner, spec: ModelSpec, tokenizer) -> None:
    """Make `runner`'s forward end in the score; before any step, so graphs capture it."""
    if spec.score_head is None:
        return
    if runner.runs or (runner.graphs is not None and runner.graphs.graphs):
        raise RuntimeError("attach_score_head must run before the runner's first step")
    head = build_score_head(spec, tokenizer).to(runner.device)
    runner.transform = head
    runner.score_head = head
    runner.dimensions = sum(o.width for o in spec.outputs) or runner.dimensions  # the logit beside the score
    if runner.graphs is not None:
        runner.graphs.scores = True
