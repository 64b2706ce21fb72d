"""Cross-encoder (reranker) and sequence-classifier folders: which score head a folder has (torch-free).

A cross-encoder reads a (query, document) pair as one sequence and gives one relevance score; ROSE's native
row for such a model is that score (width 1), computed on the device after pooling (rose.score_head), with the
logit before the model's activation beside it where there is one (outputs `score`, the default, and `logit`):
- `bert_pooler`: BertForSequenceClassification (ms-marco-MiniLM): CLS -> bert.pooler.dense + tanh -> classifier.
- `roberta_head`: RoBERTa / XLMRobertaForSequenceClassification (bge-reranker-v2-m3): CLS -> classifier.dense
  + tanh -> classifier.out_proj.
- `yes_no`: Qwen3-Reranker (Qwen3ForCausalLM): the last token's final hidden state against the lm_head rows
  of "yes" and "no" only: logit(yes) - logit(no), whose sigmoid is softmax(yes, no)[yes] = P("yes").
Then the activation sentence-transformers' CrossEncoder applies (6.x rules): `activation_fn` of
config_sentence_transformers.json, else config.json's `sentence_transformers.activation_fn`, else its
`sbert_ce_default_activation_function`, else Sigmoid (one label). ms-marco-MiniLM's folder says Identity.

A `*ForSequenceClassification` folder with two labels or more is a classifier (task "classify"), not a
reranker: the same head projects to its N labels (id2label, in index order) and its native row is the N logits,
no activation: the client picks it per request (softmax, sigmoid for problem_type multi_label_classification,
or the raw logits TEI's raw_scores asks for), so ROSE keeps what all three need. DistilBERT classifiers too
(`distilbert_head`: CLS -> pre_classifier + ReLU -> classifier); DistilBERT rerankers are not served.

Which folders are cross-encoders: `*ForSequenceClassification` architectures; a sentence-transformers
CrossEncoder folder; a Qwen3ForCausalLM folder that is a Qwen3-Reranker (its folder name says "reranker",
config.json has vLLM's `is_original_qwen3_reranker`, or modules.json ends with a LogitScore of a yes and a
no token). Anything ROSE would not score as sentence-transformers does is refused, naming the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rose.spec import ModelFolderError, Output, _optional_json, _read_json
from rose.st_modules import ACTIVATIONS

SIGMOID = "torch.nn.modules.activation.Sigmoid"
SCORE, LOGIT = "score", "logit"  # a reranker's outputs where an activation lies between them (ScoreHead.outputs)
APPLIED = ("Transformer", "LogitScore")  # the modules a cross-encoder folder may list


MULTI_LABEL = "multi_label_classification"
CLASSIFIER_KINDS = {"bert": "bert_pooler", "roberta": "roberta_head", "xlm-roberta": "roberta_head",
                    "distilbert": "distilbert_head"}  # family -> its *ForSequenceClassification head


@dataclass(frozen=True)
class ScoreHead:
    kind: str  # bert_pooler | roberta_head | distilbert_head | yes_no
    activation: str  # a value of rose.st_modules.ACTIVATIONS, applied to the logit (a classifier's: identity)
    true_token: int | str | None = None  # yes_no: the "yes" token (an id, or text the tokenizer resolves)
    false_token: int | str | None = None  # yes_no: the "no" token
    labels: tuple[str, ...] = ()  # a classifier's id2label in index order; () = a reranker (one score)
    multi_label: bool = False  # a classifier's problem_type is multi_label_classification: sigmoid, not softmax

    @property
    def outputs(self) -> tuple[Output, ...]:
        """A reranker with an activation: its score, then the logit before the activation (the raw scores vLLM's
        use_activation false and TEI's raw_scores ask for), side by side in its native row; () otherwise (the
        row is raw already: a classifier's logits, an Identity reranker's score)."""
        if self.labels or self.activation == "identity":
            return ()
        return Output(SCORE, 0, 1, False), Output(LOGIT, 1, 1, False)


def num_labels(config: dict[str, Any]) -> int:
    """As transformers counts them: id2label's size, else num_labels, else 2."""
    if config.get("id2label"):
        return len(config["id2label"])
    return int(config.get("num_labels", 2))


def _modules(model_dir: Path) -> list[dict]:
    path = model_dir / "modules.json"
    modules = _optional_json(path) or []
    if not isinstance(modules, list):
        raise ModelFolderError(f"{path}: expected a list of modules")
    return modules


def _logit_score(model_dir: Path, modules: list[dict]) -> dict | None:
    """The LogitScore module's config, None without one; other modules than Transformer + LogitScore refused."""
    path, found = model_dir / "modules.json", None
    for i, module in enumerate(modules):
        kind = str(module.get("type", "")) if isinstance(module, dict) else ""
        cls, sub = kind.rsplit(".", 1)[-1], str(module.get("path", "") or "") if isinstance(module, dict) else ""
        where = f"{path}: module {i} {kind!r} (folder {sub or '.'!r})"
        if not kind.startswith("sentence_transformers.") or cls not in APPLIED:
            raise ModelFolderError(f"{where} is not applied by ROSE to a cross-encoder (it applies "
                                   f"{', '.join(APPLIED)}); refusing to serve scores without it")
        if cls == "Transformer" and (i != 0 or sub not in ("", ".")):
            raise ModelFolderError(f"{where}: ROSE serves one Transformer, first, at the folder's root")
        if cls == "LogitScore":
            if i != len(modules) - 1:
                raise ModelFolderError(f"{where}: ROSE applies LogitScore last")
            found = _read_json(model_dir / sub / "config.json")
            if found.get("module_input_name", "causal_logits") != "causal_logits":
                raise ModelFolderError(f"{where}: LogitScore reading {found['module_input_name']!r} is not applied")
            if found.get("false_token_id") is None or found.get("true_token_id") is None:
                raise ModelFolderError(f"{where}: ROSE serves yes/no rerankers; this LogitScore needs both "
                                       "true_token_id and false_token_id")
    return found


def _activation(model_dir: Path, config: dict, st_config: dict) -> str:
    """The CrossEncoder activation's ROSE name, found where sentence-transformers 6 looks, in its order."""
    places = [(st_config.get("activation_fn"), "config_sentence_transformers.json"),
              ((config.get("sentence_transformers") or {}).get("activation_fn"), "config.json"),
              (config.get("sbert_ce_default_activation_function"), "config.json")]
    name, where = next(((n, w) for n, w in places if n), (SIGMOID, ""))
    if name not in ACTIVATIONS:
        raise ModelFolderError(f"{model_dir / where}: CrossEncoder activation_fn {name!r} is not applied by ROSE; "
                               f"supported: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def read_score_head(model_dir: Path, config: dict[str, Any], family: str, arch: str) -> ScoreHead | None:
    """The folder's score head; None when it is not a cross-encoder (an embedding model)."""
    archs = config.get("architectures") or [""]
    name = str(archs[0])
    st_config = _optional_json(model_dir / "config_sentence_transformers.json") or {}
    cross_folder = st_config.get("model_type") == "CrossEncoder"
    modules = _modules(model_dir)
    if name.endswith("ForSequenceClassification"):
        kind = CLASSIFIER_KINDS.get(family)
        if kind is None or (kind == "distilbert_head" and num_labels(config) == 1):
            raise ModelFolderError(f"{model_dir / 'config.json'}: {name} is not served by ROSE (its sequence-"
                                   "classification rerankers are BERT, RoBERTa and XLM-R; its classifiers these "
                                   "and DistilBERT)")
        _logit_score(model_dir, modules)  # refuses any module past the Transformer (a LogitScore needs logits)
        logit = None
    elif name.endswith("ForCausalLM") and family == "qwen3":
        named = "reranker" in model_dir.name.lower() or bool(config.get("is_original_qwen3_reranker"))
        if not (cross_folder or named or _lists_logit_score(modules)):
            return None  # a Qwen3 embedder saved from a causal LM (Qwen3-Embedding)
        kind, logit = "yes_no", _logit_score(model_dir, modules)
    elif cross_folder:
        raise ModelFolderError(f"{model_dir / 'config_sentence_transformers.json'}: a CrossEncoder of "
                               f"architecture {name!r} is not served by ROSE")
    else:
        return None
    prompts = {k: v for k, v in (st_config.get("prompts") or {}).items() if v}
    if prompts:
        raise ModelFolderError(f"{model_dir / 'config_sentence_transformers.json'}: CrossEncoder prompts "
                               f"{sorted(prompts)} are not applied by ROSE")
    if kind != "yes_no" and num_labels(config) > 1:
        return _classifier(model_dir, config, kind)
    head = ScoreHead(kind, _activation(model_dir, config, st_config))
    if kind == "yes_no":
        yes, no = (logit["true_token_id"], logit["false_token_id"]) if logit else ("yes", "no")
        head = ScoreHead(kind, head.activation, yes, no)
    return head


def _lists_logit_score(modules: list[dict]) -> bool:
    return any(isinstance(m, dict) and str(m.get("type", "")).endswith(".LogitScore") for m in modules)


def _classifier(model_dir: Path, config: dict[str, Any], kind: str) -> ScoreHead:
    """A classifier's head: its labels as transformers names them (id2label, else LABEL_i) and its activation's
    kind. A regression head of several outputs has no probabilities to serve: refused."""
    path, n = model_dir / "config.json", num_labels(config)
    id2label = config.get("id2label") or {str(i): f"LABEL_{i}" for i in range(n)}
    try:
        by_index = {int(k): str(v) for k, v in id2label.items()}
    except (TypeError, ValueError):
        raise ModelFolderError(f"{path}: id2label's keys must be label indices 0..{n - 1}") from None
    if sorted(by_index) != list(range(n)):
        raise ModelFolderError(f"{path}: id2label's keys must be label indices 0..{n - 1}, got {sorted(by_index)}")
    problem = config.get("problem_type")
    if problem not in (None, "single_label_classification", MULTI_LABEL):
        raise ModelFolderError(f"{path}: problem_type {problem!r} with {n} labels is not served (ROSE classifies: "
                               f"single_label_classification or {MULTI_LABEL})")
    return ScoreHead(kind, "identity", labels=tuple(by_index[i] for i in range(n)), multi_label=problem == MULTI_LABEL)
