"""SQuAD v1.1 and v2.0: doc-stride windows over exactly aligned SentencePiece tokens, a span head, n-best
decoding across windows, the official scores, and the official prediction files.

Inputs `[CLS] question [SEP] window of the context [SEP]`: questions keep their first `max_query_length` tokens;
windows advance by `doc_stride` tokens; a token is scored as a start only in the window where it has the most
context (min of left/right context, + 0.01·window length; the first window wins ties), as BERT/ALBERT do.

SQuAD v2 head: we use the span head with a null score (BERT's v2 method), NOT the original ALBERT/XLNet
answer-class head (start beam × end beam + a separate is-impossible classifier). An unanswerable question is
trained as the span ([CLS], [CLS]); at inference null = min over windows of start[CLS] + end[CLS],
null_odds = null − best non-null span score, and the answer is "" when null_odds > `null_score_diff_threshold`.
Why: one head for v1 and v2, no beam search inside the jitted step, and the official v2 scorer with the odds
as its no-answer probability reports best_exact/best_f1 with the threshold tuned on dev, which is the number
the original reports. Expect v2 numbers slightly below the original's answer-class head.

Prediction files: `predictions.json` {id: best non-null answer} and, for v2, `<stem>.null_odds.json`
{id: null odds} (the official script's --na-prob-file); apply the threshold to get a submission file.
"""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from albert_jax import storage
from albert_jax.tasks import squad_metrics
from albert_jax.tasks.alignment import AlignedText, align
from albert_jax.tasks.base import (InputError, Split, Task, TaskSettings, apply_model, check_outputs, cross_entropy,
                                    pack, read_text, stack_packed)
from albert_jax.tasks.heads import QUESTION_ANSWERING, HFHead, SpanExtractor
from albert_jax.tasks.records import check_ids, field, read_id_map, user_records


@dataclasses.dataclass
class SquadExample:
  qid: str
  question: str
  context: str
  answers: list[str]          # every annotator's answer text; [] when unanswerable or unknown
  answer_start: int = -1      # char offset of answers[0] in the context (the training target); -1: none
  is_impossible: bool = False

  @property
  def labeled(self) -> bool:
    return self.is_impossible or self.answer_start >= 0


@dataclasses.dataclass
class SquadPredictions:
  answers: dict[str, str]     # question id -> best non-null answer text
  null_odds: dict[str, float]  # question id -> null score - best span score (higher: more likely no answer)


def null_odds_path(predictions_path: str) -> str:
  return os.path.splitext(predictions_path)[0] + ".null_odds.json"


class SquadTask(Task):

  def __init__(self, settings: TaskSettings):
    super().__init__(settings)
    self.version_2 = settings.task == "squad_v2"
    self.metric_name = "best_f1" if self.version_2 else "f1"
    d = settings
    if d.max_query_length + 3 >= d.max_seq_length:
      raise ValueError(f"data.max_query_length={d.max_query_length} leaves no room for the context in "
                       f"data.max_seq_length={d.max_seq_length}.")

  # --- data -----------------------------------------------------------------------------------------------
  def split_path(self, split: str) -> str:
    version = "v2.0" if self.version_2 else "v1.1"
    return os.path.join(self.settings.path, f"{split}-{version}.json")

  def read_examples(self, path: str, labeled: bool = True) -> list[SquadExample]:
    try:
      articles = json.loads(read_text(path))["data"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
      raise InputError(path, None, f"not a SQuAD JSON file with a top-level 'data' list ({e})") from None
    return [example for article in articles for paragraph in article["paragraphs"]
            for example in self._paragraph_examples(paragraph, path)]

  def _paragraph_examples(self, paragraph, path: str):
    context = paragraph["context"]
    for qa in paragraph["qas"]:
      where = f"question {qa['id']}"
      answers = qa.get("answers", [])
      for answer in answers:
        start, text = answer["answer_start"], answer["text"]
        if not 0 <= start <= len(context) - len(text) or context[start:start + len(text)] != text:
          raise InputError(path, where, f"answer {text!r} is not in its context at answer_start={start} "
                                        f"(context has {len(context)} characters)")
      impossible = bool(qa.get("is_impossible", False))
      if impossible and not self.version_2:
        raise InputError(path, where, "unanswerable question (is_impossible) in a SQuAD v1.1 task; use "
                                      "experiments/squad_v2.py")
      yield SquadExample(qa["id"], qa["question"], context, [a["text"] for a in answers],
                         -1 if impossible or not answers else answers[0]["answer_start"], impossible)

  def read_user_examples(self, path: str) -> list[SquadExample]:
    """JSON lines {"id", "question", "context"}, or a file in SQuAD's own format."""
    records = list(user_records(path))
    if len(records) == 1 and "data" in records[0][1]:
      return [dataclasses.replace(ex, answers=[], answer_start=-1, is_impossible=False)
              for ex in self.read_examples(path)]
    return [SquadExample(str(r.get("id", line)), field(r, "question", path, line), field(r, "context", path, line),
                         []) for line, r in records]

  def featurize(self, examples: list[SquadExample], tokenizer):
    d = self.settings
    labeled = all(ex.labeled for ex in examples)
    rows, labels, info = [], [], {"example_index": [], "token_start_char": [], "token_end_char": [],
                                  "max_context": []}
    aligned: dict[str, AlignedText] = {}
    for index, ex in enumerate(examples):
      if ex.context not in aligned:  # paragraphs have several questions: align each context once
        aligned[ex.context] = align(tokenizer, ex.context)
      doc = aligned[ex.context]
      if not doc.ids:
        raise ValueError(f"question {ex.qid}: its context has no text to take an answer from.")
      query = tokenizer.encode(ex.question)[:d.max_query_length]
      windows = _windows(len(doc.ids), d.max_seq_length - len(query) - 3, d.doc_stride)
      best_window = _max_context_window(windows, len(doc.ids))
      answer = None
      if labeled and not ex.is_impossible:
        answer = doc.token_span(ex.answer_start, ex.answer_start + len(ex.answers[0]))
      offset = len(query) + 2
      for w, (start, length) in enumerate(windows):
        rows.append(pack(query, doc.ids[start:start + length], tokenizer.cls_id, tokenizer.sep_id,
                         d.max_seq_length))
        char_start, char_end = np.full((2, d.max_seq_length), -1, np.int32)
        char_start[offset:offset + length] = doc.start[start:start + length]
        char_end[offset:offset + length] = doc.end[start:start + length]
        max_context = np.zeros(d.max_seq_length, bool)
        max_context[offset:offset + length] = best_window[start:start + length] == w
        for key, value in (("example_index", index), ("token_start_char", char_start),
                           ("token_end_char", char_end), ("max_context", max_context)):
          info[key].append(value)
        inside = answer is not None and start <= answer[0] and answer[1] < start + length
        labels.append((answer[0] - start + offset, answer[1] - start + offset) if inside else (0, 0))
    features = stack_packed(rows, (len(rows),))
    if labeled:
      features["start_positions"], features["end_positions"] = np.asarray(labels, np.int32).T.copy()
    return features, {key: np.asarray(value) for key, value in info.items()}

  # --- model ----------------------------------------------------------------------------------------------
  def make_model(self, model_config):
    return SpanExtractor(model_config)

  hf_head = HFHead(QUESTION_ANSWERING)

  def dummy_batch(self, batch_size: int) -> dict[str, np.ndarray]:
    shape = (batch_size, self.settings.max_seq_length)
    zeros = np.zeros(batch_size, np.int32)
    return {"input_ids": np.zeros(shape, np.int32), "attention_mask": np.ones(shape, np.int32),
            "token_type_ids": np.zeros(shape, np.int32), "start_positions": zeros, "end_positions": zeros}

  def loss_and_metrics(self, model, params, batch, rng, deterministic: bool):
    start_logits, end_logits = apply_model(model, params, batch, rng, deterministic)
    start_loss, start_acc = cross_entropy(start_logits, batch["start_positions"])
    end_loss, end_acc = cross_entropy(end_logits, batch["end_positions"])
    loss = (start_loss + end_loss) / 2
    return loss, {"loss": loss, "start_accuracy": start_acc, "end_accuracy": end_acc}

  def predict_step(self, model, params, batch):
    start_logits, end_logits = apply_model(model, params, batch)
    return {"start_logits": start_logits, "end_logits": end_logits}

  # --- outputs --------------------------------------------------------------------------------------------
  def postprocess(self, split: Split, outputs) -> SquadPredictions:
    """Best span per window among the n-best starts × n-best ends (end >= start, at most max_answer_length
    tokens, start in its max-context window), then the best window per question."""
    check_outputs(split, outputs)
    info, d = split.info, self.settings
    starts = np.asarray(outputs["start_logits"], np.float64)
    ends = np.asarray(outputs["end_logits"], np.float64)
    in_doc = info["token_start_char"] >= 0
    span_score, span_start, span_end = _best_spans(np.where(in_doc & info["max_context"], starts, -np.inf),
                                                   np.where(in_doc, ends, -np.inf), d.n_best_size,
                                                   d.max_answer_length)
    null_score = starts[:, 0] + ends[:, 0]
    answers, null_odds = {}, {}
    bounds = np.flatnonzero(np.diff(info["example_index"], prepend=-1, append=len(split.examples)))
    for lo, hi in zip(bounds[:-1], bounds[1:]):
      ex = split.examples[info["example_index"][lo]]
      f = lo + int(np.argmax(span_score[lo:hi]))  # finite: every token is a valid 1-token span in some window
      answers[ex.qid] = ex.context[info["token_start_char"][f, span_start[f]]:info["token_end_char"][f, span_end[f]]]
      null_odds[ex.qid] = float(null_score[lo:hi].min() - span_score[f])
    return SquadPredictions(answers, null_odds)

  def score(self, split: Split, predictions: SquadPredictions) -> dict[str, float]:
    """The official scores, and `missing`: questions without a prediction, which the official scripts score 0
    (v1.1) or leave out of every total (v2.0)."""
    gold = {ex.qid: ex.answers for ex in split.examples}
    if not self.version_2:
      scores = squad_metrics.evaluate_v1(gold, predictions.answers)
    else:
      scores = squad_metrics.evaluate_v2(gold, predictions.answers, predictions.null_odds,
                                         self.settings.null_score_diff_threshold)
    return {**scores, "missing": sum(qid not in predictions.answers for qid in gold)}

  def write_predictions(self, split: Split, predictions: SquadPredictions, path: str) -> None:
    _write_json(path, predictions.answers)
    if self.version_2:
      _write_json(null_odds_path(path), predictions.null_odds)

  def read_predictions(self, path: str, split: Split) -> SquadPredictions:
    """The official format, {question id: answer text} (v2: and the null odds file), for ids of `split` only."""
    answers = read_id_map(path, "an answer text", lambda v: isinstance(v, str))
    check_ids(path, answers, split)
    if not self.version_2:
      return SquadPredictions(answers, {})
    odds_path = null_odds_path(path)
    null_odds = read_id_map(odds_path, "a number (the null odds)",
                            lambda v: isinstance(v, (int, float)) and not isinstance(v, bool))
    check_ids(odds_path, null_odds, split)
    unmatched = [qid for qid in answers if qid not in null_odds]
    if unmatched:
      raise InputError(odds_path, None, f"no null odds for {len(unmatched)} answered question(s), e.g. "
                                        f"{unmatched[0]}; pass the file written with {path}.")
    return SquadPredictions(answers, null_odds)


def _write_json(path: str, values: dict) -> None:
  storage.write_atomic(path, json.dumps(values, ensure_ascii=False, indent=1))


def _windows(num_tokens: int, max_tokens: int, stride: int) -> list[tuple[int, int]]:
  """(start, length) of each doc-stride window; the last one ends at the last token."""
  windows, start = [], 0
  while True:
    length = min(max_tokens, num_tokens - start)
    windows.append((start, length))
    if start + length >= num_tokens:
      return windows
    start += min(length, stride)


def _max_context_window(windows: list[tuple[int, int]], num_tokens: int) -> np.ndarray:
  """For each token, the window where it has the most context on its shorter side (first window on ties)."""
  position = np.arange(num_tokens)
  scores = np.full((len(windows), num_tokens), -np.inf)
  for w, (start, length) in enumerate(windows):
    inside = (position >= start) & (position < start + length)
    context = np.minimum(position - start, start + length - 1 - position) + 0.01 * length
    scores[w, inside] = context[inside]
  return scores.argmax(0)


def _best_spans(start_logits: np.ndarray, end_logits: np.ndarray, n_best: int, max_answer_length: int):
  """Per row: (score, start, end) of the best valid span among the top-n starts × top-n ends; -inf if none."""
  n_best = min(n_best, start_logits.shape[1])
  top_start = np.argsort(-start_logits, axis=1, kind="stable")[:, :n_best]
  top_end = np.argsort(-end_logits, axis=1, kind="stable")[:, :n_best]
  s, e = top_start[:, :, None], top_end[:, None, :]
  scores = (np.take_along_axis(start_logits, top_start, 1)[:, :, None]
            + np.take_along_axis(end_logits, top_end, 1)[:, None, :])
  scores = np.where((e >= s) & (e - s < max_answer_length), scores, -np.inf).reshape(len(scores), -1)
  best = scores.argmax(1)
  rows = np.arange(len(scores))
  return scores[rows, best], top_start[rows, best // n_best], top_end[rows, best % n_best]
