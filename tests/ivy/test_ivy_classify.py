"""POST /predict (text-embeddings-inference's) and POST /classify (vLLM's) in front of a sequence classifier: the
answers' shapes, labels in id2label's order, softmax / sigmoid (problem_type multi_label_classification) / raw
logits, pairs tokenized as the classifier reads them (BERT's token types sent), limits and errors naming the
field, the task in /v1/models and /info, usage and metrics; other routes on a classifier answer 400."""

from __future__ import annotations

import numpy as np
import pytest
from cross_folders import bert_classifier
from fake_tulip import FakeTulip, fake_logits
from ivy_testkit import gateway
from prometheus_client import REGISTRY

from rose.spec import load_spec
from rose.tokenizer import Tokenizer

LABELS = ["joy", "anger", "fear"]
TEXTS = ["cats sleep on the sofa", "stock prices fell today", "where do birds fly"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("ivy-classifiers")
    return {"single": bert_classifier(root),
            "multi": bert_classifier(root, "minilm-multi", problem_type="multi_label_classification")}


def served(folder, **overrides):
    fake = FakeTulip(model_dir=folder)
    return fake, gateway(fake, model=str(folder), **overrides)


def logits_of(folder, items) -> tuple[np.ndarray, list]:
    """The fake model's logits for texts and (text, text_pair) tuples, tokenized as the model reads them."""
    tok = Tokenizer(load_spec(folder))
    seqs, types = [], []
    for item in items:
        enc = tok.encode_pairs([item])[0] if isinstance(item, tuple) else tok.encode(item)
        seqs.append(list(enc.ids))
        types.append(list(enc.type_ids) if isinstance(item, tuple) else [0] * len(enc.ids))
    return fake_logits(seqs, 3, types), seqs


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def as_label_order(predictions: list[dict]) -> list[float]:
    scores = [p["score"] for p in predictions]
    assert scores == sorted(scores, reverse=True) and sorted(p["label"] for p in predictions) == sorted(LABELS)
    return [next(p["score"] for p in predictions if p["label"] == label) for label in LABELS]


def test_predict_one_text_one_pair_and_a_batch(folders):
    fake, gw = served(folders["single"])
    with fake, gw as client:
        one = client.post("/predict", json={"inputs": TEXTS[0]})
        assert one.status_code == 200, one.text
        want = softmax(logits_of(folders["single"], TEXTS[:1])[0])
        np.testing.assert_allclose(as_label_order(one.json()), want[0], atol=1e-6)
        assert fake.calls[-1].token_types == b""  # texts only: no types sent
        pair = client.post("/predict", json={"inputs": ["where do cats sleep", TEXTS[0]]}).json()
        want = softmax(logits_of(folders["single"], [("where do cats sleep", TEXTS[0])])[0])
        np.testing.assert_allclose(as_label_order(pair), want[0], atol=1e-6)  # a pair is one input, a flat list
        assert 1 in fake.calls[-1].token_types  # the pair's second text is type 1
        items = [TEXTS[1], ("where do cats sleep", TEXTS[2]), TEXTS[0]]
        batch = client.post("/predict", json={"inputs": [[i] if isinstance(i, str) else list(i) for i in items]})
        logits, seqs = logits_of(folders["single"], items)
        got = batch.json()
        assert len(got) == 3 and all(isinstance(answer, list) for answer in got)
        np.testing.assert_allclose([as_label_order(a) for a in got], softmax(logits), atol=1e-6)
        assert fake.calls[-1].seqs == 3 and fake.calls[-1].tokens == sum(map(len, seqs))


def test_raw_scores_and_multi_label_sigmoid(folders):
    fake, gw = served(folders["multi"])
    with fake, gw as client:
        logits = logits_of(folders["multi"], TEXTS[:1])[0][0]
        sig = as_label_order(client.post("/predict", json={"inputs": TEXTS[0]}).json())
        np.testing.assert_allclose(sig, 1 / (1 + np.exp(-logits)), atol=1e-6)
        assert abs(sum(sig) - 1) > 1e-3  # not a softmax
        raw = as_label_order(client.post("/predict", json={"inputs": TEXTS[0], "raw_scores": True}).json())
        np.testing.assert_allclose(raw, logits, atol=1e-6)


def test_classify_in_vllms_shape(folders):
    fake, gw = served(folders["single"])
    with fake, gw as client:
        r = client.post("/classify", json={"model": "minilm-emotions", "input": TEXTS})
        assert r.status_code == 200, r.text
        body = r.json()
        logits, seqs = logits_of(folders["single"], TEXTS)
        assert body["id"].startswith("classify-") and body["object"] == "list" and body["model"] == "minilm-emotions"
        assert body["usage"] == {"prompt_tokens": sum(map(len, seqs)), "total_tokens": sum(map(len, seqs)),
                                 "completion_tokens": 0, "prompt_tokens_details": None}
        assert [d["index"] for d in body["data"]] == [0, 1, 2] and {d["num_classes"] for d in body["data"]} == {3}
        np.testing.assert_allclose([d["probs"] for d in body["data"]], softmax(logits), atol=1e-6)  # label order
        assert [d["label"] for d in body["data"]] == [LABELS[i] for i in logits.argmax(axis=1)]
        raw = client.post("/classify", json={"input": TEXTS[0], "use_activation": False}).json()
        np.testing.assert_allclose(raw["data"][0]["probs"], logits[0], atol=1e-6)
        ids = client.post("/classify", json={"input": seqs[:2]}).json()  # token ids, as /v1/embeddings takes
        np.testing.assert_allclose([d["probs"] for d in ids["data"]], softmax(logits[:2]), atol=1e-6)


def test_limits_and_errors_name_the_field(folders):
    fake, gw = served(folders["single"], max_inputs_per_request=2, truncate=False)
    long = " ".join(["cats"] * 400)
    with fake, gw as client:
        def error(route, body, status):
            r = client.post(route, json=body)
            assert r.status_code == status, r.text
            return r.json()["error"]["param"]

        assert error("/predict", {"inputs": [["a"], ["b"], ["c"]]}, 422) == "inputs"  # too_many_inputs: every route's
        assert error("/classify", {"input": ["a", "b", "c"]}, 422) == "input"
        assert error("/predict", {"inputs": [["a"], ["cats", long]]}, 422) == "inputs[1][1]"
        assert error("/predict", {"inputs": [[long], ["a"]]}, 422) == "inputs[0][0]"
        assert error("/predict", {"inputs": long}, 422) == "inputs"
        assert error("/classify", {"input": ["a", long]}, 422) == "input[1]"
        assert error("/predict", {"inputs": ["a", "b", "c"]}, 422) == "inputs"
        assert error("/predict", {"inputs": [["a"], [""]]}, 400) == "inputs[1][0]"
        assert error("/classify", {"input": "a", "truncate_prompt_tokens": 1}, 422) == "truncate_prompt_tokens"
        assert not fake.calls  # refused before any work
        assert client.post("/predict", json={"inputs": [["cats", long]], "truncate": True}).status_code == 200
        assert client.post("/classify", json={"input": long, "truncate_prompt_tokens": 8}).status_code == 200
        assert fake.calls[-1].tokens == 8


def test_the_task_is_listed_and_other_routes_refuse(folders, client):
    for route, body in (("/predict", {"inputs": "hi"}), ("/classify", {"input": "hi"})):
        r = client.post(route, json=body)  # the bundled embedding model
        assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_task", r.text
    fake, gw = served(folders["single"])
    with fake, gw as c:
        card = c.get("/v1/models").json()["data"][0]
        assert (card["tasks"], card["dimensions"]) == (["classify"], 3)
        info = c.get("/info").json()["model_type"]
        assert info == {"classifier": {"id2label": {"0": "joy", "1": "anger", "2": "fear"},
                                       "label2id": {"joy": 0, "anger": 1, "fear": 2}}}
        for route, body in (("/v1/embeddings", {"input": "hi"}), ("/embed", {"inputs": "hi"}),
                            ("/v1/rerank", {"query": "q", "documents": ["d"]}),
                            ("/v1/score", {"text_1": "q", "text_2": ["d"]}),
                            ("/rerank", {"query": "q", "texts": ["d"]})):
            r = c.post(route, json=body)
            assert r.status_code == 400, (route, r.text)
            error = r.json()["error"]
            assert error["code"] == "unsupported_task" and "'classify'" in error["message"], route
        assert not fake.calls


def test_usage_metrics_count_inputs_and_tokens(folders):
    def counted(route):
        return [REGISTRY.get_sample_value(f"ivy_{n}_total", {"route": route}) or 0.0 for n in ("inputs", "tokens")]

    fake, gw = served(folders["single"])
    with fake, gw as client:
        before = counted("/predict"), counted("/classify")
        client.post("/predict", json={"inputs": [["a"], ["b", "c"]]})
        predict_tokens = fake.calls[-1].tokens
        client.post("/classify", json={"input": TEXTS})
        after = counted("/predict"), counted("/classify")
        assert [a - b for a, b in zip(after[0], before[0])] == [2, predict_tokens]
        assert [a - b for a, b in zip(after[1], before[1])] == [3, fake.calls[-1].tokens]
        metrics = client.get("/metrics").text  # the requests under their own routes, not "other"
        assert 'ivy_requests_total{route="/predict",status="200"}' in metrics
        assert 'ivy_requests_total{route="/classify",status="200"}' in metrics


def test_vllms_optional_and_older_fields_and_teis_order_of_ties(folders, monkeypatch):
    """vLLM's use_activation is optional (None: on) and `softmax` its older name; add_special_tokens false is
    refused naming it (texts are classified with the model's special tokens, as /pooling refuses it); /pooling's
    task classify points here; equal scores come out as TEI orders them (the later label first)."""
    fake, gw = served(folders["single"])
    with fake, gw as client:
        raw = client.post("/classify", json={"input": "hi", "use_activation": False}).json()["data"][0]["probs"]
        on = client.post("/classify", json={"input": "hi", "use_activation": None})
        assert on.status_code == 200 and on.json()["data"][0]["probs"] != raw
        assert client.post("/classify", json={"input": "hi", "softmax": False}).json()["data"][0]["probs"] == raw
        bad = client.post("/classify", json={"input": "hi", "add_special_tokens": False})
        assert bad.status_code == 422 and bad.json()["error"]["param"] == "add_special_tokens", bad.text
        pooling = client.post("/pooling", json={"input": "hi", "task": "classify"})
        assert pooling.status_code == 400 and "/classify" in pooling.json()["error"]["message"]
    import fake_tulip

    monkeypatch.setattr(fake_tulip, "fake_logits", lambda seqs, labels, types=None: np.zeros((len(seqs), labels),
                                                                                           np.float32))
    fake, gw = served(folders["single"])  # three equal scores
    with fake, gw as client:
        answer = client.post("/predict", json={"inputs": "a tie"}).json()
        assert [a["label"] for a in answer] == LABELS[::-1]
