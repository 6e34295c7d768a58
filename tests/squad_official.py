"""The official SQuAD evaluation, written out from evaluate-v1.1.py / evaluate-v2.0.py: the independent scorer
that the SQuAD metrics and prediction files are checked against."""
import collections
import re
import string


def official_normalize(s):
  def remove_articles(text):
    return re.sub(r"\b(a|an|the)\b", " ", text)

  def white_space_fix(text):
    return " ".join(text.split())

  def remove_punc(text):
    exclude = set(string.punctuation)
    return "".join(ch for ch in text if ch not in exclude)
  return white_space_fix(remove_articles(remove_punc(s.lower())))


def official_f1_v1(prediction, ground_truth):
  prediction_tokens = official_normalize(prediction).split()
  ground_truth_tokens = official_normalize(ground_truth).split()
  common = collections.Counter(prediction_tokens) & collections.Counter(ground_truth_tokens)
  num_same = sum(common.values())
  if num_same == 0:
    return 0
  precision = 1.0 * num_same / len(prediction_tokens)
  recall = 1.0 * num_same / len(ground_truth_tokens)
  return (2 * precision * recall) / (precision + recall)


def official_v1(dataset, predictions):
  f1 = exact_match = total = 0
  for article in dataset:
    for paragraph in article["paragraphs"]:
      for qa in paragraph["qas"]:
        total += 1
        if qa["id"] not in predictions:
          continue
        truths = [a["text"] for a in qa["answers"]]
        pred = predictions[qa["id"]]
        exact_match += max(official_normalize(pred) == official_normalize(t) for t in truths)
        f1 += max(official_f1_v1(pred, t) for t in truths)
  return {"exact_match": 100.0 * exact_match / total, "f1": 100.0 * f1 / total}


def official_f1_v2(a_gold, a_pred):
  gold_toks, pred_toks = official_normalize(a_gold).split(), official_normalize(a_pred).split()
  common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
  num_same = sum(common.values())
  if len(gold_toks) == 0 or len(pred_toks) == 0:
    return int(gold_toks == pred_toks)
  if num_same == 0:
    return 0
  precision, recall = num_same / len(pred_toks), num_same / len(gold_toks)
  return (2 * precision * recall) / (precision + recall)


def official_v2(dataset, preds, na_probs, na_prob_thresh):
  qid_to_has_ans = {qa["id"]: bool(qa["answers"]) for a in dataset for p in a["paragraphs"] for qa in p["qas"]}
  exact_raw, f1_raw = {}, {}
  for article in dataset:
    for p in article["paragraphs"]:
      for qa in p["qas"]:
        gold = [a["text"] for a in qa["answers"] if official_normalize(a["text"])] or [""]
        exact_raw[qa["id"]] = max(int(official_normalize(a) == official_normalize(preds[qa["id"]])) for a in gold)
        f1_raw[qa["id"]] = max(official_f1_v2(a, preds[qa["id"]]) for a in gold)

  def apply(scores):
    return {q: float(not qid_to_has_ans[q]) if na_probs[q] > na_prob_thresh else s for q, s in scores.items()}

  def summary(e, f, qids):
    return 100.0 * sum(e[q] for q in qids) / len(qids), 100.0 * sum(f[q] for q in qids) / len(qids)

  exact, f1 = apply(exact_raw), apply(f1_raw)
  out = dict(zip(("exact", "f1"), summary(exact, f1, list(exact))))
  has = [q for q in exact if qid_to_has_ans[q]]
  no = [q for q in exact if not qid_to_has_ans[q]]
  out["HasAns_exact"], out["HasAns_f1"] = summary(exact, f1, has)
  out["NoAns_exact"], out["NoAns_f1"] = summary(exact, f1, no)

  def best(scores):
    cur = best_score = sum(1 for k in qid_to_has_ans if not qid_to_has_ans[k])
    best_thresh = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
      if qid not in scores:
        continue
      diff = scores[qid] if qid_to_has_ans[qid] else (-1 if preds[qid] else 0)
      cur += diff
      if cur > best_score:
        best_score, best_thresh = cur, na_probs[qid]
    return 100.0 * best_score / len(scores), best_thresh
  out["best_exact"], out["best_exact_thresh"] = best(exact_raw)
  out["best_f1"], out["best_f1_thresh"] = best(f1_raw)
  return out
