"""The official SQuAD scores (v1.1 `evaluate-v1.1.py`, v2.0 `evaluate-v2.0.py`), same rules and output keys.

Both normalise an answer by lower-casing, dropping ASCII punctuation, the articles a/an/the and extra
whitespace; EM and token F1 take the max over the gold answers. Differences kept on purpose:
- v1.1: F1 is 0 when no token is shared (also for two empty strings); a question with no prediction scores 0.
- v2.0: gold answers that normalise to "" are dropped, and a question with none has the single gold ""; F1 of
  two token lists where either is empty is 1 if both are empty else 0; questions without a prediction are
  left out of every total. A no-answer probability (here the null odds) above `na_prob_thresh` means the
  prediction "" ; best_exact / best_f1 sweep that threshold over the sorted odds (the number reported for v2).
"""
from __future__ import annotations

import collections
import re
import string

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text: str) -> str:
  text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
  return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
  return float(normalize_answer(prediction) == normalize_answer(gold))


def f1_v1(prediction: str, gold: str) -> float:
  return _token_f1(normalize_answer(prediction).split(), normalize_answer(gold).split())


def f1_v2(prediction: str, gold: str) -> float:
  pred, truth = normalize_answer(prediction).split(), normalize_answer(gold).split()
  if not pred or not truth:
    return float(pred == truth)
  return _token_f1(pred, truth)


def _token_f1(pred: list[str], truth: list[str]) -> float:
  same = sum((collections.Counter(pred) & collections.Counter(truth)).values())
  if same == 0:
    return 0.0
  precision, recall = same / len(pred), same / len(truth)
  return 2 * precision * recall / (precision + recall)


def evaluate_v1(gold: dict[str, list[str]], predictions: dict[str, str]) -> dict[str, float]:
  """gold: question id -> answer texts. Returns {"exact_match", "f1"} in percent over all gold questions."""
  exact = f1 = 0.0
  for qid, answers in gold.items():
    if qid not in predictions:
      continue
    exact += max(exact_match(predictions[qid], a) for a in answers)
    f1 += max(f1_v1(predictions[qid], a) for a in answers)
  return {"exact_match": 100.0 * exact / len(gold), "f1": 100.0 * f1 / len(gold)}


def evaluate_v2(gold: dict[str, list[str]], predictions: dict[str, str], na_probs: dict[str, float],
                na_prob_thresh: float = 1.0) -> dict[str, float]:
  """gold: question id -> answer texts ([] = unanswerable). The official v2.0 evaluation with a no-answer
  probability file: exact/f1 at `na_prob_thresh`, HasAns_/NoAns_ breakdowns and the best thresholds."""
  has_answer = {qid: bool(answers) for qid, answers in gold.items()}
  exact_raw, f1_raw = {}, {}
  for qid, answers in gold.items():
    if qid not in predictions:
      continue
    answers = [a for a in answers if normalize_answer(a)] or [""]
    exact_raw[qid] = max(exact_match(predictions[qid], a) for a in answers)
    f1_raw[qid] = max(f1_v2(predictions[qid], a) for a in answers)

  def thresholded(raw):
    return {qid: float(not has_answer[qid]) if na_probs[qid] > na_prob_thresh else score
            for qid, score in raw.items()}

  exact, f1 = thresholded(exact_raw), thresholded(f1_raw)
  out = _summary(exact, f1, list(exact), "")
  for prefix, wanted in (("HasAns_", True), ("NoAns_", False)):
    qids = [qid for qid in exact if has_answer[qid] == wanted]
    if qids:
      out.update(_summary(exact, f1, qids, prefix))
  for name, raw in (("exact", exact_raw), ("f1", f1_raw)):
    out[f"best_{name}"], out[f"best_{name}_thresh"] = _best_threshold(predictions, raw, na_probs, has_answer)
  return out


def _summary(exact, f1, qids, prefix) -> dict[str, float]:
  total = len(qids)
  return {f"{prefix}exact": 100.0 * sum(exact[q] for q in qids) / total,
          f"{prefix}f1": 100.0 * sum(f1[q] for q in qids) / total, f"{prefix}total": total}


def _best_threshold(predictions, raw, na_probs, has_answer) -> tuple[float, float]:
  """Start from "predict no answer everywhere" and switch questions to their span in increasing null odds.

  "Everywhere" is a threshold below every question's odds: the official script's 0.0 for probabilities, but
  null-score odds and answer-class logits can be negative, where 0.0 would answer some questions."""
  score = best = sum(1 for answerable in has_answer.values() if not answerable)
  lowest = min(na_probs.values(), default=1.0)
  best_thresh = 0.0 if lowest > 0 else lowest - 1.0
  for qid in sorted(na_probs, key=lambda q: na_probs[q]):
    if qid not in raw:
      continue
    if has_answer[qid]:
      score += raw[qid]
    elif predictions[qid]:
      score -= 1
    if score > best:
      best, best_thresh = score, na_probs[qid]
  return 100.0 * best / len(raw), best_thresh
