"""SQuAD v1.1 and v2.0: doc-stride windows over exactly aligned SentencePiece tokens, a span head, n-best
decoding across windows, the official scores, and the official prediction files.

Inputs `[CLS] question [SEP] window of the context [SEP]`: questions keep their first `max_query_length` tokens;
windows advance by `doc_stride` tokens; a token is scored as a start only in the window where it has the most
context (min of left/right context, + 0.01·window length; the first window wins ties), as BERT/ALBERT do.

SQuAD v2 has two heads, picked with `data.v2_head` (experiments/squad_v2.py:head=...):
- "null_score" (default; BERT's v2 method): the v1 span head, an unanswerable question (or a window without the
  answer) trained as the span ([CLS], [CLS]); null = min over windows of start[CLS] + end[CLS], and
  null_odds = null − best non-null span score. One head for v1 and v2, exports to AlbertForQuestionAnswering.
- "answer_class" (the original ALBERT/XLNet `run_squad_v2.py`, `heads.AnswerClassSpanHead`): end logits
  conditioned on the start token (the gold one in training), a beam of `start_n_top` starts × `end_n_top` ends
  run inside the jitted predict step, and an answer-class logit trained with binary cross-entropy on "this
  window has no answer"; loss = (start + end)/2 + 0.5·BCE, as the original. null_odds = min over windows of the
  class logit. The head behind the original's reported v2 numbers; transformers has no such head.
Either way the answer is "" when null_odds > `null_score_diff_threshold`, and the official v2 scorer with the odds
as its no-answer probability reports best_exact/best_f1 with the threshold tuned on dev (the reported number).

Prediction files: `predictions.json` {id: best non-null answer}; `<stem>.nbest.json` {id: [{text, probability,
start_logit, end_logit}, ...]} (the answer-class head's scores are log-probabilities); for v2 `<stem>.null_odds.json`
{id: null odds} (the official script's --na-prob-file); apply the threshold to get a submission file.
"""
from __future__ import annotations

import dataclasses
import json
import os

import jax.numpy as jnp
import numpy as np
import optax

from albert_jax import families, storage
from albert_jax.errors import InputError, MissingFileError
from albert_jax.head_identity import HFHead
from albert_jax.tasks import squad_decode, squad_metrics
from albert_jax.tasks.alignment import AlignedText, align
from albert_jax.tasks.base import (Split, Task, TaskSettings, apply_model, check_outputs, cross_entropy, pack,
                                   stack_packed)
from albert_jax.tasks.input_text import DataFileError, read_text
from albert_jax.tasks.heads import AnswerClassSpanHead, SpanExtractor
from albert_jax.tasks.records import Ids, check_ids, field, optional_id, parse_json, read_id_map, user_records


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
  null_odds: dict[str, float]  # question id -> null odds (higher: more likely no answer; see the module docstring)
  nbest: dict[str, list] = dataclasses.field(default_factory=dict)  # question id -> n-best entries (squad_decode)


V2_HEADS = ("null_score", "answer_class")


def null_odds_path(predictions_path: str) -> str:
  return os.path.splitext(predictions_path)[0] + ".null_odds.json"


def nbest_path(predictions_path: str) -> str:
  return os.path.splitext(predictions_path)[0] + ".nbest.json"


class SquadTask(Task):
  predictions_suffix = ".json"
  download = ("squad", "squad")
  length_buckets_apply = False  # outputs per token, over windows of max_seq_length that most contexts fill

  def __init__(self, settings: TaskSettings):
    super().__init__(settings)
    self.version_2 = settings.task == "squad_v2"
    self.metric_name = "best_f1" if self.version_2 else "f1"
    d = settings
    if d.max_query_length + 3 >= d.max_seq_length:
      raise InputError(f"data.max_query_length={d.max_query_length} leaves no room for the context in "
                       f"data.max_seq_length={d.max_seq_length}; give --config.data.max_query_length="
                       f"{max(d.max_seq_length - 4, 1)} or less.")
    if d.v2_head not in V2_HEADS:
      raise InputError(f"data.v2_head={d.v2_head!r}; choose one of {', '.join(map(repr, V2_HEADS))}.")
    self.answer_class = d.v2_head == "answer_class"
    if self.answer_class and not self.version_2:
      raise InputError("data.v2_head='answer_class' is a SQuAD v2 head; use experiments/squad_v2.py.")
    for name in ("start_n_top", "end_n_top"):
      if self.answer_class and not 1 <= getattr(d, name) <= d.max_seq_length:
        raise InputError(f"data.{name}={getattr(d, name)}; choose a beam width from 1 to data.max_seq_length="
                         f"{d.max_seq_length} (the original uses 5).")
    # transformers has no answer-class head: `formats.hf_albert.save_hf` refuses those weights by name.
    self.hf_head = None if self.answer_class else HFHead(self.head_family.hf_class(families.QUESTION_ANSWERING))

  # --- data -----------------------------------------------------------------------------------------------
  def split_path(self, split: str) -> str:
    version = "v2.0" if self.version_2 else "v1.1"
    return os.path.join(self.settings.path, f"{split}-{version}.json")

  def read_examples(self, path: str, labeled: bool = True) -> list[SquadExample]:
    """Ids are unique: a repeat is named by the questions' ordinals in the file (both have that id). Every
    level's fields are checked, so a file of another layout is named by the field it lacks, not a KeyError."""
    try:
      top = parse_json(read_text(path), path)
    except json.JSONDecodeError as e:
      raise DataFileError(path, None, f"not a SQuAD JSON file with a top-level 'data' list ({e})") from None
    articles = field(_object(top, path, None, "the file"), "data", path, None, list)
    examples = [example for a, article in enumerate(articles, start=1)
                for p, paragraph in enumerate(field(_object(article, path, f"article #{a}", "an article"),
                                                    "paragraphs", path, f"article #{a}", list), start=1)
                for example in self._paragraph_examples(
                    _object(paragraph, path, f"article #{a} paragraph #{p}", "a paragraph"), path,
                    f"article #{a} paragraph #{p}")]
    ids = Ids(path)
    for number, example in enumerate(examples, start=1):
      ids.add(example.qid, f"question #{number}")
    return examples

  def _paragraph_examples(self, paragraph, path: str, where: str):
    context = field(paragraph, "context", path, where)
    for qa in field(paragraph, "qas", path, where, list):
      qid = str(field(_object(qa, path, where, "a question"), "id", path, where, (str, int)))
      at = f"question {qid}"
      answers = field(qa, "answers", path, at, list) if "answers" in qa else []
      for answer in answers:
        answer = _object(answer, path, at, "an answer")
        start, text = field(answer, "answer_start", path, at, int), field(answer, "text", path, at)
        if not 0 <= start <= len(context) - len(text) or context[start:start + len(text)] != text:
          raise DataFileError(path, at, f"answer {text!r} is not in its context at answer_start={start} "
                                     f"(context has {len(context)} characters)")
      impossible = bool(qa.get("is_impossible", False))
      if impossible and not self.version_2:
        raise DataFileError(path, at, "unanswerable question (is_impossible) in a SQuAD v1.1 task; use "
                                   "experiments/squad_v2.py")
      yield SquadExample(qid, field(qa, "question", path, at), context, [a["text"] for a in answers],
                         -1 if impossible or not answers else answers[0]["answer_start"], impossible)

  def read_user_examples(self, path: str) -> list[SquadExample]:
    """JSON lines {"id" (optional: else the row number; unique), "question", "context"}, or a file in SQuAD's own
    format."""
    records = list(user_records(path))
    if len(records) == 1 and "data" in records[0][1]:
      return [dataclasses.replace(ex, answers=[], answer_start=-1, is_impossible=False)
              for ex in self.read_examples(path)]
    ids = Ids(path)
    return [SquadExample(optional_id(r, path, line, row, ids), field(r, "question", path, line),
                         field(r, "context", path, line), []) for row, (line, r) in enumerate(records)]

  def featurize(self, examples: list[SquadExample], tokenizer):
    d, layout = self.settings, tokenizer.pair_layout
    if self.answer_class and not layout.second_segment:  # heads.answer_positions finds the context by its segment
      raise InputError(f"data.v2_head='answer_class' tells the context from the question by its token type, which "
                       f"the {layout.name} pair layout of {tokenizer.model_path} leaves 0; use "
                       "data.v2_head='null_score'.")
    labeled = all(ex.labeled for ex in examples)
    rows, labels, info = [], [], {"example_index": [], "token_start_char": [], "token_end_char": [],
                                  "max_context": []}
    aligned: dict[str, AlignedText] = {}
    for index, ex in enumerate(examples):
      if ex.context not in aligned:  # paragraphs have several questions: align each context once
        aligned[ex.context] = align(tokenizer, ex.context)
      doc = aligned[ex.context]
      if not doc.ids:
        raise InputError(f"question {ex.qid}: its context has no text to take an answer from.")
      query = tokenizer.encode(ex.question)[:d.max_query_length]
      windows = _windows(len(doc.ids), d.max_seq_length - len(query) - layout.special_tokens(pair=True),
                         d.doc_stride)
      best_window = _max_context_window(windows, len(doc.ids))
      answer = None
      if labeled and not ex.is_impossible:
        answer = doc.token_span(ex.answer_start, ex.answer_start + len(ex.answers[0]))
      offset = layout.second_start(len(query))
      for w, (start, length) in enumerate(windows):
        rows.append(pack(query, doc.ids[start:start + length], tokenizer.cls_id, tokenizer.sep_id,
                         d.max_seq_length, layout))
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
  def identity(self) -> dict:
    return {**super().identity(), "v2_head": self.settings.v2_head} if self.version_2 else super().identity()

  def make_model(self, model_config):
    if self.answer_class:
      d = self.settings
      return AnswerClassSpanHead(model_config, d.start_n_top, d.end_n_top, d.classifier_dropout_prob)
    return SpanExtractor(model_config)

  def dummy_batch(self, batch_size: int) -> dict[str, np.ndarray]:
    shape = (batch_size, self.settings.max_seq_length)
    zeros = np.zeros(batch_size, np.int32)
    return {"input_ids": np.zeros(shape, np.int32), "attention_mask": np.ones(shape, np.int32),
            "token_type_ids": np.zeros(shape, np.int32), "start_positions": zeros, "end_positions": zeros}

  def loss_and_metrics(self, model, params, batch, rng, deterministic: bool):
    if not self.answer_class:
      start_logits, end_logits = apply_model(model, params, batch, rng, deterministic)
    else:  # end logits conditioned on the gold start (teacher forcing)
      start_logits, end_logits, cls_logits = apply_model(model, params, batch, rng, deterministic,
                                                         start_positions=batch["start_positions"])
    start_loss, start_acc = cross_entropy(start_logits, batch["start_positions"])
    end_loss, end_acc = cross_entropy(end_logits, batch["end_positions"])
    loss = (start_loss + end_loss) / 2
    metrics = {"start_accuracy": start_acc, "end_accuracy": end_acc}
    if self.answer_class:  # a window is "impossible" when its target is the null span (no answer inside it)
      impossible = (batch["start_positions"] == 0).astype(jnp.float32)
      class_loss = optax.sigmoid_binary_cross_entropy(cls_logits, impossible).mean()
      loss += 0.5 * class_loss  # the original's weight: keeps it on the scale of the span losses
      metrics.update(class_loss=class_loss, class_accuracy=((cls_logits > 0) == (impossible > 0)).mean())
    return loss, {"loss": loss, **metrics}

  def predict_step(self, model, params, batch):
    if self.answer_class:
      return apply_model(model, params, batch)  # the beam's top-k arrays and the class logits
    start_logits, end_logits = apply_model(model, params, batch)
    return {"start_logits": start_logits, "end_logits": end_logits}

  # --- outputs --------------------------------------------------------------------------------------------
  def postprocess(self, split: Split, outputs) -> SquadPredictions:
    """Each question's n-best over its windows' candidate spans (`squad_decode`), its best non-null answer and
    its null odds (module docstring)."""
    check_outputs(split, outputs)
    d = self.settings
    if self.answer_class:
      candidates = squad_decode.beam_candidates(outputs)
      null_score = np.asarray(outputs["cls_logits"], np.float64)
    else:
      starts = np.asarray(outputs["start_logits"], np.float64)
      ends = np.asarray(outputs["end_logits"], np.float64)
      candidates = squad_decode.span_candidates(starts, ends, split.info, d.n_best_size)
      null_score = starts[:, 0] + ends[:, 0]
    nbest = squad_decode.nbest_answers(split, candidates, d.n_best_size, d.max_answer_length)
    answers, null_odds = {}, {}
    for ex, lo, hi in squad_decode.example_windows(split):
      best = nbest[ex.qid][0]
      answers[ex.qid] = best["text"]
      null = float(null_score[lo:hi].min())
      null_odds[ex.qid] = null if self.answer_class else null - (best["start_logit"] + best["end_logit"])
    return SquadPredictions(answers, null_odds, nbest)

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
    if predictions.nbest:
      _write_json(nbest_path(path), predictions.nbest)

  def read_predictions(self, path: str, split: Split) -> SquadPredictions:
    """The official format, {question id: answer text} (v2: and the null odds file), for ids of `split` only."""
    answers = read_id_map(path, "an answer text", lambda v: isinstance(v, str))
    check_ids(path, answers, split)
    if not self.version_2:
      return SquadPredictions(answers, {})
    odds_path = null_odds_path(path)
    if not storage.path(odds_path).exists():
      raise MissingFileError(f"{odds_path} not found: SQuAD v2 answers are scored with their null odds, which "
                             f"--mode=predict writes there beside {path}; keep the two files together.")
    null_odds = read_id_map(odds_path, "a number (the null odds)",
                            lambda v: isinstance(v, (int, float)) and not isinstance(v, bool))
    check_ids(odds_path, null_odds, split)
    unmatched = [qid for qid in answers if qid not in null_odds]
    if unmatched:
      raise DataFileError(odds_path, None, f"no null odds for {len(unmatched)} answered question(s), e.g. "
                                        f"{unmatched[0]}; pass the file written with {path}.")
    return SquadPredictions(answers, null_odds)


def _object(value, path: str, where: str | None, what: str) -> dict:
  if not isinstance(value, dict):
    raise DataFileError(path, where, f"{what} should be a JSON object, got {type(value).__name__}; is this a SQuAD "
                                  "file?")
  return value


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
