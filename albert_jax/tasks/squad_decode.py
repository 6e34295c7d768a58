"""SQuAD decoding on the host: candidate spans of every window -> each question's n-best answers, for both heads.

A head's predict step leaves, per feature (window), C candidate spans in rank order with a start and an end score:
- the span head (v1.1, and v2's null-score head): the top `n_best_size` starts x the top `n_best_size` ends by
  logit (BERT's and the original's v1 decoder), `span_candidates`;
- v2's answer-class head: the beam its jitted predict step ran, start_n_top x end_n_top by log-probability
  (`heads.AnswerClassSpanHead`), `beam_candidates`.
A candidate counts when its start is a context token in its max-context window, its end a context token, end >=
start and the span at most `max_answer_length` tokens ([CLS], the null span, never counts). A question's
candidates from all its windows are ranked by start + end score (stable: earlier windows, then beam order, win
ties), repeated texts are dropped, and the first `n_best_size` are its n-best, with softmax probabilities over
their totals, as both originals write them. The n-best holds answers only: "no answer" is the null odds' job.
"""
from __future__ import annotations

import dataclasses
from typing import Iterator

import numpy as np

NO_SPAN = -1e6  # start and end score of the "" placeholder when no candidate counts (the original's nonce entry)


@dataclasses.dataclass
class Candidates:
  """Per feature, C candidate spans: token positions [F, C] and their scores [F, C] (logits or log-probs)."""
  start: np.ndarray
  end: np.ndarray
  start_score: np.ndarray
  end_score: np.ndarray


def span_candidates(start_logits: np.ndarray, end_logits: np.ndarray, info: dict[str, np.ndarray],
                    n_best: int) -> Candidates:
  """Top-n starts (among the window's max-context tokens) x top-n ends (among its context tokens)."""
  in_doc = info["token_start_char"] >= 0
  starts = np.where(in_doc & info["max_context"], start_logits, -np.inf)
  ends = np.where(in_doc, end_logits, -np.inf)
  n_best = min(n_best, starts.shape[1])
  top_start = np.argsort(-starts, axis=1, kind="stable")[:, :n_best]
  top_end = np.argsort(-ends, axis=1, kind="stable")[:, :n_best]
  pairs = lambda a, b: (np.repeat(a, n_best, axis=1), np.tile(b, (1, n_best)))  # start-major, as the beam
  start, end = pairs(top_start, top_end)
  start_score, end_score = pairs(np.take_along_axis(starts, top_start, 1), np.take_along_axis(ends, top_end, 1))
  return Candidates(start, end, start_score, end_score)


def beam_candidates(outputs: dict[str, np.ndarray]) -> Candidates:
  """The answer-class head's beam: start i with its end j is candidate i * end_n_top + j."""
  end = np.asarray(outputs["end_top_index"])
  rows, end_n_top = len(end), end.shape[-1]
  return Candidates(np.repeat(np.asarray(outputs["start_top_index"]), end_n_top, axis=1), end.reshape(rows, -1),
                    np.repeat(np.asarray(outputs["start_top_log_probs"], np.float64), end_n_top, axis=1),
                    np.asarray(outputs["end_top_log_probs"], np.float64).reshape(rows, -1))


def example_windows(split) -> Iterator[tuple[object, int, int]]:
  """(example, first feature row, end row) per question; an example's windows are consecutive rows."""
  index = split.info["example_index"]
  bounds = np.flatnonzero(np.diff(index, prepend=-1, append=len(split.examples)))
  for lo, hi in zip(bounds[:-1], bounds[1:]):
    yield split.examples[index[lo]], int(lo), int(hi)


def nbest_answers(split, candidates: Candidates, n_best_size: int,
                  max_answer_length: int) -> dict[str, list[dict[str, float | str]]]:
  """{question id: [{text, probability, start_logit, end_logit}, ...]}, best first (never empty)."""
  info, c = split.info, candidates
  rows = np.arange(len(c.start))[:, None]
  in_doc = info["token_start_char"] >= 0
  valid = (in_doc[rows, c.start] & info["max_context"][rows, c.start] & in_doc[rows, c.end] & (c.end >= c.start)
           & (c.end - c.start < max_answer_length))
  total = c.start_score + c.end_score
  out = {}
  for ex, lo, hi in example_windows(split):
    feature, column = np.nonzero(valid[lo:hi])  # window-major, then rank order: the tie order
    feature += lo
    entries, seen = [], set()
    for k in np.argsort(-total[feature, column], kind="stable"):
      f, j = feature[k], column[k]
      text = ex.context[info["token_start_char"][f, c.start[f, j]]:info["token_end_char"][f, c.end[f, j]]]
      if text not in seen:
        seen.add(text)
        entries.append((text, float(c.start_score[f, j]), float(c.end_score[f, j])))
      if len(entries) == n_best_size:
        break
    entries = entries or [("", NO_SPAN, NO_SPAN)]
    scores = np.array([s + e for _, s, e in entries])
    probs = np.exp(scores - scores.max())
    probs /= probs.sum()
    out[ex.qid] = [{"text": text, "probability": float(p), "start_logit": s, "end_logit": e}
                   for (text, s, e), p in zip(entries, probs)]
  return out
