"""Train a tokenizer (`python -m data_pipeline.train_spm --help`): --model_type=unigram (the default) a SentencePiece
model with ALBERT's settings, written to the --output .model file; bpe (RoBERTa's byte-level BPE) or wordpiece
(BERT's) into the --output folder, as `data_pipeline.train_vocab` says.

Unigram follows the README's recipe: unigram, <pad> 0, <unk> 1, control symbols [CLS] [SEP] [MASK] (ids 2-4), no
BOS/EOS, character_coverage 0.99995, user symbols ( ) " - . – £ €, a random sample of `input_sentence_size`
sentences. Text is streamed (ALBERT's `preprocess_text` applied, so lower-cased like the model's input) through a
reservoir sampler (`sample`), so memory is bounded by the sample, not the corpus; the sample is drawn here, seeded by
--seed, because the trainer's own sampler gives another sample in every process whatever its seed. A sentence
longer than the trainer's `max_sentence_length` (a paragraph per line, as in Wikipedia extracts) is fed in pieces
cut at spaces: the trainer would skip it without a word. bpe and wordpiece learn from the same sample, with only
white space collapsed (their own pipelines normalise the text).
"""
from __future__ import annotations

import argparse
import io
import itertools
import json
import os
import random
import re
import sys
from typing import Iterator

import sentencepiece as spm

from albert_jax import storage
from albert_jax.errors import InputError
from data_pipeline import cli, train_vocab, writers
from data_pipeline.progress import Progress
from data_pipeline.sentences import split_sentences
from data_pipeline.sources import Source, raw_pieces
from data_pipeline.tokenization import preprocess_text

CONTROL_SYMBOLS = ["[CLS]", "[SEP]", "[MASK]"]
USER_SYMBOLS = ["(", ")", '"', "-", ".", "\u2013", "\u00a3", "\u20ac"]
FIXED_PIECES = 2 + len(CONTROL_SYMBOLS) + len(USER_SYMBOLS)   # <pad> <unk>, then the symbols
MAX_SENTENCE_BYTES = 4192   # the trainer's max_sentence_length (its default), passed to it explicitly
# The trainer's own words for a vocabulary this text cannot fill, or one too small for its characters.
_TOO_LARGE = re.compile(r"Vocabulary size too high \(\d+\)\. Please set it to a value <= (\d+)")
_TOO_SMALL = re.compile(r"Vocabulary size is smaller than required_chars\. \d+ vs (\d+)")


MODEL_TYPES = ("unigram", "bpe", "wordpiece")


def sentences(source: Source, do_lower_case: bool = True, progress: Progress | None = None,
              albert_preprocessing: bool = True) -> Iterator[str]:
  """The source's sentences, preprocessed as the model's input is (ALBERT's `preprocess_text`, or with
  `albert_preprocessing` False white space collapsed only) and cut to at most MAX_SENTENCE_BYTES (so the count is
  what the trainer learns from); `progress` is told per document."""
  count = 0
  for doc in source.documents():
    for unit in doc.units:
      for sentence in split_sentences(unit) if source.splits_sentences else (unit,):
        text = (preprocess_text(sentence, lower=do_lower_case) if albert_preprocessing
                else " ".join(sentence.split()))
        for raw, _ in raw_pieces(io.BytesIO(text.encode()), MAX_SENTENCE_BYTES):
          if piece := raw.decode().strip():
            count += 1
            yield piece
    if progress:
      progress.update(count, doc.position)


def sample(stream: Iterator[str], size: int, seed: int) -> list[str]:
  """A uniform random sample of `size` sentences, a function of the sentences and `seed` alone (Algorithm R): the
  first `size` fill it in order; then sentence i (counted from 0) takes the place of entry j, drawn by
  random.Random(seed).randrange(i + 1), when j < size. With at most `size` sentences, all of them in their order."""
  rng, kept = random.Random(seed), []
  for i, sentence in enumerate(stream):
    if i < size:
      kept.append(sentence)
    elif (j := rng.randrange(i + 1)) < size:
      kept[j] = sentence
  return kept


def _handed_over(kept: list[str]) -> Iterator[str]:
  """`kept` in order, each let go once yielded, so the trainer's copy and this list do not both hold the sample."""
  kept.reverse()
  while kept:
    yield kept.pop()


def train(source: Source, model_path: str, vocab_size: int = 30000, input_sentence_size: int = 10_000_000,
          seed: int = 0, num_threads: int = 1, do_lower_case: bool | None = None, model_type: str = "unigram") -> str:
  """Train on the sentences of `source` and write `model_path` (a .model file; for bpe and wordpiece a folder);
  returns the path. The arguments and the input are checked before training (InputError), and the trainer's errors
  about them are told in its flags' words. One run writes `model_path` at a time (`writers.WriterLock`,
  `model_path`.lock), never over an input. `do_lower_case` unset: lower-cased but for bpe, which keeps case."""
  if model_type not in MODEL_TYPES:
    raise InputError(f"--model_type={model_type} is not one of {', '.join(MODEL_TYPES)}; pass one of them.")
  if model_type == "bpe" and do_lower_case:
    raise InputError("--do_lower_case=true with --model_type=bpe: byte-level BPE keeps case, as RoBERTa's does; "
                     "leave --do_lower_case unset.")
  do_lower_case = model_type != "bpe" if do_lower_case is None else do_lower_case
  if model_type != "unigram":
    return _train_vocab(source, model_path, vocab_size, input_sentence_size, seed, do_lower_case, model_type)
  cli.check_at_least("vocab_size", vocab_size, FIXED_PIECES + 1)
  cli.check_at_least("input_sentence_size", input_sentence_size, 0)
  cli.check_at_least("num_threads", num_threads, 1)
  if storage.path(model_path).is_dir():
    raise InputError(f"--output={model_path} is a directory; pass the path of the .model file to write, e.g. "
                     f"--output={os.path.join(model_path, 'spm.model')}.")
  for file in source.files("data_pipeline.train_spm"):   # also says if --input names a file twice
    writers.check_apart("--output", model_path, "--input", file, "the model", new="file")
  with writers.WriterLock(f"{model_path}.lock", f"--output={model_path}", "--output",
                          cli.on_stderr("data_pipeline.train_spm")):
    storage.write_atomic(model_path, _trained(source, vocab_size, input_sentence_size, seed, num_threads,
                                              do_lower_case))
  return model_path


def _train_vocab(source: Source, folder: str, vocab_size: int, input_sentence_size: int, seed: int,
                 do_lower_case: bool, model_type: str) -> str:
  """bpe or wordpiece (`data_pipeline.train_vocab`): its files written into `folder`."""
  cli.check_at_least("vocab_size", vocab_size, train_vocab.MIN_VOCAB[model_type])
  cli.check_at_least("input_sentence_size", input_sentence_size, 0)
  if storage.path(folder).is_file():
    raise InputError(f"--output={folder} is a file; with --model_type={model_type} pass the folder to write its "
                     f"files into, e.g. --output={os.path.splitext(folder)[0]}_{model_type}.")
  for file in source.files("data_pipeline.train_spm"):
    writers.check_apart("--output", folder, "--input", file, "the tokenizer")
  with writers.WriterLock(f"{folder}.lock", f"--output={folder}", "--output", cli.on_stderr("data_pipeline.train_spm")):
    progress = Progress(f"data_pipeline.train_spm ({model_type}, vocab {vocab_size:,})", "sentences read",
                        source.total())
    feed = sentences(source, do_lower_case, progress, albert_preprocessing=False)
    kept = sample(feed, input_sentence_size, seed) if input_sentence_size else list(feed)
    if not kept:
      raise InputError(f"No text in --input={source.input!r}; check --format (now {source.format!r}) and "
                       "--text_field, and that the files hold text.")
    files = (train_vocab.bpe_files(_handed_over(kept), vocab_size) if model_type == "bpe" else
             train_vocab.wordpiece_files(_handed_over(kept), vocab_size, do_lower_case))
    progress.done()
    learnt = (len(json.loads(files["vocab.json"])) if model_type == "bpe"
              else files["vocab.txt"].decode().count("\n"))
    if learnt < vocab_size:
      print(f"data_pipeline.train_spm: warning: this text gives {learnt:,} tokens, fewer than --vocab_size="
            f"{vocab_size:,}; train the model with --config.model.vocab_size={learnt}, or train on more text.",
            file=sys.stderr, flush=True)
    storage.path(folder).mkdir(parents=True, exist_ok=True)
    for name, contents in files.items():
      storage.write_atomic(os.path.join(folder, name), contents)
  return folder


def _trained(source: Source, vocab_size: int, input_sentence_size: int, seed: int, num_threads: int,
             do_lower_case: bool) -> bytes:
  model = io.BytesIO()
  progress = Progress(f"data_pipeline.train_spm (vocab {vocab_size:,})", "sentences read", source.total())
  feed = sentences(source, do_lower_case, progress)
  if input_sentence_size:   # the trainer gets no more than it keeps, so its own sampler never draws
    feed = _handed_over(sample(feed, input_sentence_size, seed))
  first = next(feed, None)
  if first is None:
    raise InputError(f"No text in --input={source.input!r}; check --format (now {source.format!r}) and "
                     "--text_field, and that the files hold text.")
  errors = []

  def guarded() -> Iterator[str]:
    """The sentences; an error while reading (a binary file) is kept, since the trainer turns it into its own."""
    try:
      yield from itertools.chain([first], feed)
    except Exception as e:
      errors.append(e)
      raise

  spm.set_random_generator_seed(seed)   # any other randomness of the trainer's
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=guarded(), model_writer=model, model_type="unigram", vocab_size=vocab_size, pad_id=0,
        unk_id=1, bos_id=-1, eos_id=-1, control_symbols=CONTROL_SYMBOLS, user_defined_symbols=USER_SYMBOLS,
        character_coverage=0.99995, input_sentence_size=input_sentence_size, shuffle_input_sentence=True,
        max_sentence_length=MAX_SENTENCE_BYTES, num_threads=num_threads, minloglevel=2)
  except RuntimeError as e:
    if errors:
      raise errors[0] from None
    if most := _TOO_LARGE.search(str(e)):
      raise InputError(f"--vocab_size={vocab_size} is more than this text supports: at most {most[1]}; lower "
                       "--vocab_size or train on more text.") from None
    if least := _TOO_SMALL.search(str(e)):
      raise InputError(f"--vocab_size={vocab_size} is less than this text needs: at least {least[1]} (a piece "
                       "for each character kept, and the fixed pieces); raise --vocab_size.") from None
    raise
  progress.done()
  return model.getvalue()


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="python -m data_pipeline.train_spm", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--input", required=True, help="comma-separated files/globs, or tfds:NAME[:SPLIT]")
  parser.add_argument("--format", default="lines", help="lines | paragraphs | jsonl (see data_pipeline.sources)")
  parser.add_argument("--text_field", default="text")
  parser.add_argument("--tfds_data_dir", default=None)
  parser.add_argument("--output", required=True,
                      help="path of the .model file to write (unigram), or of the folder (bpe, wordpiece)")
  parser.add_argument("--model_type", default="unigram", help=" | ".join(MODEL_TYPES))
  parser.add_argument("--vocab_size", type=int, default=30000)
  parser.add_argument("--input_sentence_size", type=int, default=10_000_000,
                      help="sentences sampled for training (0: all); the sample is fixed by --seed")
  parser.add_argument("--do_lower_case", type=cli.boolean, default=None,
                      help="lower-case the text (default: true, but false for bpe, which keeps case)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--num_threads", type=int, default=os.cpu_count() or 1)
  args = parser.parse_args(sys.argv[1:] if argv is None else argv)
  source = Source(args.input, args.format, args.text_field, args.tfds_data_dir)
  train(source, args.output, args.vocab_size, args.input_sentence_size, args.seed, args.num_threads,
        args.do_lower_case, args.model_type)
  print(args.output)


if __name__ == "__main__":
  cli.run("data_pipeline.train_spm", main)
