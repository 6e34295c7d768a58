"""Classification, regression and entity metrics, written out in NumPy so scoring needs no scikit-learn, scipy
or seqeval (tests compare against them or against hand counts).

Definitions as GLUE reports them: accuracy; F1 of the positive class (MRPC, QQP); Matthews correlation in
its multi-class form (Gorodkin 2004, = the binary phi coefficient; 0 when undefined, as scikit-learn); Pearson
and Spearman (Pearson of average ranks, ties share their mean rank) for STS-B. Macro F1 as scikit-learn's
`average="macro"` over the classes seen in labels or predictions. Multi-label scores of multi-hot [N, C] arrays as
scikit-learn's `f1_score(average="micro"/"macro")` and `accuracy_score` (subset accuracy), and per-class decision
thresholds tuned for F1. Entities as seqeval's default mode (the conlleval rules), micro-averaged over entity types.
"""
from __future__ import annotations

import numpy as np


def accuracy(labels, predictions) -> float:
  return float(np.mean(np.asarray(labels) == np.asarray(predictions)))


def f1_binary(labels, predictions) -> float:
  labels, predictions = np.asarray(labels) == 1, np.asarray(predictions) == 1
  tp = np.sum(labels & predictions)
  denominator = 2 * tp + np.sum(~labels & predictions) + np.sum(labels & ~predictions)
  return float(2 * tp / denominator) if denominator else 0.0


def matthews_corrcoef(labels, predictions) -> float:
  labels, predictions = np.asarray(labels), np.asarray(predictions)
  classes, encoded = np.unique(np.concatenate([labels, predictions]), return_inverse=True)
  truth, pred = encoded[:len(labels)], encoded[len(labels):]
  confusion = np.zeros((len(classes), len(classes)), np.float64)
  np.add.at(confusion, (truth, pred), 1)
  t_sum, p_sum = confusion.sum(1), confusion.sum(0)
  n = confusion.sum()
  cov_tp = np.trace(confusion) * n - t_sum @ p_sum
  cov_pp = n * n - p_sum @ p_sum
  cov_tt = n * n - t_sum @ t_sum
  return float(cov_tp / np.sqrt(cov_tt * cov_pp)) if cov_tt * cov_pp else 0.0


def pearson(x, y) -> float:
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  x, y = x - x.mean(), y - y.mean()
  denominator = np.sqrt((x @ x) * (y @ y))
  return float(x @ y / denominator) if denominator else 0.0


def average_ranks(x) -> np.ndarray:
  x = np.asarray(x)
  ranks = np.empty(len(x), np.float64)
  ranks[np.argsort(x, kind="stable")] = np.arange(1, len(x) + 1)
  _, group, counts = np.unique(x, return_inverse=True, return_counts=True)
  return (np.bincount(group, weights=ranks) / counts)[group]


def spearman(x, y) -> float:
  return pearson(average_ranks(x), average_ranks(y))


def macro_f1(labels, predictions) -> float:
  labels, predictions = np.asarray(labels), np.asarray(predictions)
  scores = []
  for c in np.unique(np.concatenate([labels, predictions])):
    tp = np.sum((labels == c) & (predictions == c))
    denominator = np.sum(labels == c) + np.sum(predictions == c)
    scores.append(2 * tp / denominator)
  return float(np.mean(scores))


def mse(labels, predictions) -> float:
  return float(np.mean(np.square(np.asarray(labels, np.float64) - np.asarray(predictions, np.float64))))


def multi_label_scores(labels, predictions) -> dict[str, float]:
  """Micro F1 (every class's decisions pooled), macro F1 (the mean over every class; one neither labelled nor
  predicted anywhere scores 0, scikit-learn's default) and subset accuracy (rows whose whole label set is right)."""
  labels, predictions = np.asarray(labels, bool), np.asarray(predictions, bool)
  true_positives = np.sum(labels & predictions, axis=0)
  denominators = np.sum(labels, axis=0) + np.sum(predictions, axis=0)  # 2 TP + FP + FN, per class
  per_class = np.divide(2 * true_positives, denominators, out=np.zeros(len(denominators)), where=denominators > 0)
  micro = 2 * true_positives.sum() / denominators.sum() if denominators.sum() else 0.0
  return {"micro_f1": float(micro), "macro_f1": float(per_class.mean()),
          "subset_accuracy": float(np.mean(np.all(labels == predictions, axis=1)))}


def best_thresholds(labels, probabilities, default: float = 0.5) -> np.ndarray:
  """Per class, the threshold t (the class is predicted where its probability >= t) that maximises the class's F1,
  from the class's own probabilities; of equally good ones the highest (the fewest positives). A class no
  threshold finds a positive of (none labelled) keeps `default`."""
  labels, probabilities = np.asarray(labels, bool), np.asarray(probabilities, np.float64)
  thresholds = np.full(labels.shape[1], default)
  for c in range(labels.shape[1]):
    order = np.argsort(-probabilities[:, c], kind="stable")
    candidates = probabilities[order, c]
    predicted = np.arange(1, len(candidates) + 1)  # rows predicted with t = candidates[k]: the first k + 1 ...
    whole = np.append(candidates[1:] != candidates[:-1], True)  # ... when no later row has the same probability
    f1 = np.where(whole, 2 * np.cumsum(labels[order, c]) / (predicted + labels[:, c].sum()), -1.0)
    best = int(np.argmax(f1))  # the first best in descending order: the highest threshold
    if f1[best] > 0:
      thresholds[c] = candidates[best]
  return thresholds


BY_NAME = {"accuracy": accuracy, "f1": f1_binary, "macro_f1": macro_f1, "mcc": matthews_corrcoef, "pearson": pearson,
           "spearman": spearman, "mse": mse}


def _split_tag(tag: str) -> tuple[str, str]:
  """"B-PER" -> ("B", "PER"); "O" -> ("O", "_"); a bare "PER" -> ("P", "ER"), as seqeval reads it."""
  return tag[:1], tag[1:].split("-", maxsplit=1)[-1] or "_"


def _chunk_ends(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
  return (prev_tag in ("E", "S") or (prev_tag in ("B", "I") and tag in ("B", "S", "O"))
          or (prev_tag not in ("O", ".") and prev_type != type_))


def _chunk_starts(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
  return (tag in ("B", "S") or (prev_tag in ("E", "S", "O") and tag in ("E", "I"))
          or (tag not in ("O", ".") and prev_type != type_))


def entities(tags: list[str]) -> set[tuple[str, int, int]]:
  """(type, first, last) of every chunk in one sentence's IOB1/IOB2/IOE/IOBES tags (seqeval's `get_entities`)."""
  chunks, prev_tag, prev_type, begin = set(), "O", "", 0
  for i, tag in enumerate([*tags, "O"]):
    tag, type_ = _split_tag(tag)
    if _chunk_ends(prev_tag, tag, prev_type, type_):
      chunks.add((prev_type, begin, i - 1))
    if _chunk_starts(prev_tag, tag, prev_type, type_):
      begin = i
    prev_tag, prev_type = tag, type_
  return chunks


def entity_scores(gold: list[list[str]], predicted: list[list[str]]) -> dict[str, float]:
  """Micro precision, recall and F1 over entities (an entity counts only with its exact type and span), and the
  accuracy over words; the numbers of seqeval's `classification_report` "micro avg" row and `accuracy_score`."""
  true = {(s, *e) for s, tags in enumerate(gold) for e in entities(tags)}
  pred = {(s, *e) for s, tags in enumerate(predicted) for e in entities(tags)}
  correct = len(true & pred)
  precision = correct / len(pred) if pred else 0.0
  recall = correct / len(true) if true else 0.0
  f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
  words = [g == p for gs, ps in zip(gold, predicted, strict=True) for g, p in zip(gs, ps, strict=True)]
  return {"f1": f1, "precision": precision, "recall": recall, "accuracy": float(np.mean(words)) if words else 0.0}
