"""Byte-level BPE and WordPiece beside SentencePiece: the trainer's files (deterministic, read by transformers' own
classes with our ids), `prepare` on each kind (the manifest's kind and file hashes, ids that decode back to the
text, the loader's batches), whole-word masking by each tokenizer's word-start marker, pretraining on each kind's
preparation (resumed exactly) and RoBERTa's tiny run on the bundled corpus tokenized by a byte-level BPE."""
import csv
import hashlib
import json
import shutil

import numpy as np
import pytest
import tokenizers

from albert_jax import pretrain
from albert_jax.cli import experiment_config
from albert_jax.errors import InputError
from albert_jax.run import Run
from albert_jax.tasks import alignment
from albert_jax.weights import record
from data_pipeline import records, train_spm
from data_pipeline.loader import DocumentSource, make_pretraining_iterator
from data_pipeline.masking import Masker, segment_starts_word, start_piece_table
from data_pipeline.prepare import PrepareConfig, prepare
from data_pipeline.sources import Source
from data_pipeline.tokenizer_json import byte_level_bpe
from data_pipeline.wordpiece import WordPieceTokenizer, load_tokenizer
from tests.helpers import assert_trees_equal, final_params, logged, quietly

pytestmark = pytest.mark.shared_data

WORDS = "the cat sat on a mat while dogs ran far away from home and never came back".split()


def _corpus(shared_data, tmp_path):
  """A few KB of prose: the first 300 lines of a book."""
  lines = (shared_data / "corpus" / "gutenberg_00035_time_machine.txt").read_text(encoding="utf-8").splitlines()
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("\n".join(lines[:300]) + "\n", encoding="utf-8")
  return corpus


def _glue_sentences(shared_data):
  with open(shared_data / "glue" / "RTE" / "dev.tsv", encoding="utf-8") as f:
    rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[:40]
  return [(row["sentence1"], row["sentence2"]) for row in rows]


def _trained(corpus, folder, model_type, vocab_size, *flags):
  train_spm.main([f"--input={corpus}", f"--output={folder}", f"--model_type={model_type}",
                  f"--vocab_size={vocab_size}", *flags])
  return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


@pytest.mark.hf
def test_trained_bpe_and_wordpiece_are_deterministic_and_give_transformers_ids(shared_data, tmp_path):
  transformers = pytest.importorskip("transformers")
  corpus = _corpus(shared_data, tmp_path)
  bpe = _trained(corpus, tmp_path / "bpe", "bpe", 400)
  assert sorted(bpe) == ["merges.txt", "tokenizer.json", "vocab.json"]
  assert _trained(corpus, tmp_path / "bpe_again", "bpe", 400) == bpe
  vocab = json.loads(bpe["vocab.json"])
  assert [vocab[t] for t in ("<s>", "<pad>", "</s>", "<unk>", "<mask>")] == [0, 1, 2, 3, 4] and len(vocab) == 400
  wordpiece = _trained(corpus, tmp_path / "wp", "wordpiece", 300)
  assert sorted(wordpiece) == ["vocab.txt"]
  assert _trained(corpus, tmp_path / "wp_again", "wordpiece", 300) == wordpiece
  pieces = wordpiece["vocab.txt"].decode().splitlines()
  assert pieces[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and len(pieces) == 300
  assert "##e" in pieces and "the" in pieces and pieces[5:] == [p.lower() for p in pieces[5:]]   # uncased

  ours = load_tokenizer(str(tmp_path / "bpe" / "vocab.json"))
  from_json = load_tokenizer(str(tmp_path / "bpe" / "tokenizer.json"))
  roberta = transformers.RobertaTokenizerFast(str(tmp_path / "bpe" / "vocab.json"),
                                              str(tmp_path / "bpe" / "merges.txt"))
  fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "bpe" / "tokenizer.json"))
  bert = {lower: transformers.BertTokenizerFast(str(tmp_path / "wp" / "vocab.txt"), do_lower_case=lower)
          for lower in (True, False)}
  for first, second in _glue_sentences(shared_data) + [("Café  CRÈME, naïve — “1999” 😀", "日本 x")]:
    for text in (first, second):
      ids = ours.encode(text)
      assert ids == from_json.encode(text) == roberta(text, add_special_tokens=False)["input_ids"]
      assert ids == fast(text, add_special_tokens=False)["input_ids"] and ours.decode(ids) == text
      for lower in (True, False):
        assert WordPieceTokenizer(str(tmp_path / "wp" / "vocab.txt"), lower).encode(text) == bert[lower](
            text, add_special_tokens=False)["input_ids"]
    # RoBERTa's pairs, <s> A </s></s> B </s>, from the tokenizer.json's own post-processor
    pair = roberta(first, second)["input_ids"]
    assert pair == from_json.hf.encode(first, second).ids == fast(first, second)["input_ids"]
    assert pair[0] == 0 and pair.count(2) == 3 and pair[-1] == 2
  assert (ours.kind, ours.cls_id, ours.sep_id, ours.pad_id, ours.unk_id, ours.mask_id) == ("bpe", 0, 2, 1, 3, 4)
  # SQuAD's answer spans: each token's characters in the original text, the space before a word left out
  text = "The Time  Traveller (for so"
  aligned = alignment.align(ours, text)
  assert [text[a:b] for a, b in zip(aligned.start, aligned.end)] == [
      "The", "Time", "", "Traveller", "", "(", "f", "or", "so"] and aligned.ids == ours.encode(text)
  assert aligned.token_span(text.index("Traveller"), text.index(" (")) == (3, 3)
  assert ours.tokenize("The cat")[1].startswith("\u0120") and not ours.do_lower_case


def test_trainer_refusals_name_the_flag(shared_data, tmp_path):
  corpus = _corpus(shared_data, tmp_path)
  (tmp_path / "a_file").write_text("x")
  cases = [
      (["--model_type=bpe", "--do_lower_case=true"], r"^--do_lower_case=true with --model_type=bpe: byte-level BPE"),
      (["--model_type=char"], r"^--model_type=char is not one of unigram, bpe, wordpiece"),
      (["--model_type=bpe", "--vocab_size=200"], r"^--vocab_size=200 must be at least 261\.$"),
      (["--model_type=wordpiece", f"--output={tmp_path / 'a_file'}"], r"is a file; with --model_type=wordpiece"),
  ]
  for flags, message in cases:
    output = [] if any(f.startswith("--output") for f in flags) else [f"--output={tmp_path / 'out'}"]
    with pytest.raises(InputError, match=message):
      train_spm.main([f"--input={corpus}", *output, *flags])
  assert not (tmp_path / "out").exists()


def test_unreadable_tokenizer_files_are_refused_naming_the_file(tmp_path):
  (tmp_path / "vocab.json").write_text('{"a": 0}')
  (tmp_path / "tokenizer.json").write_text("{not json")
  bare = tmp_path / "bare"
  bare.mkdir()
  (bare / "tokenizer.json").write_text(byte_level_bpe({"a": 0, "b": 1, "ab": 2}, [("a", "b")]).to_str())
  not_byte_level = tokenizers.Tokenizer(tokenizers.models.BPE({"a": 0, "<unk>": 1}, [], unk_token="<unk>"))
  not_byte_level.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace()
  not_byte_level.save(str(tmp_path / "metaspace.json"))
  cases = [(tmp_path / "metaspace.json", r"a tokenizer of a kind not read here .*; pass a byte-level BPE, a"),
           (tmp_path / "vocab.json", r"merges.txt' not found; pass a tokenizer.json, or a BPE vocab.json"),
           (tmp_path / "tokenizer.json", r"tokenizer.json is not a tokenizer file \(.*\); pass a tokenizer.json"),
           (bare / "tokenizer.json", r"has no \[PAD\] \(or <pad>\) token; pass one with the special tokens")]
  for path, message in cases:
    with pytest.raises(InputError, match=message):
      load_tokenizer(str(path))


def _text_corpus(tmp_path):
  """Documents of a few sentences over a small word list, a blank line between documents."""
  rng = np.random.default_rng(0)
  docs = ["\n".join(" ".join(rng.choice(WORDS, rng.integers(3, 9))).capitalize() + "."
                    for _ in range(rng.integers(2, 5))) for _ in range(60)]
  corpus = tmp_path / "text.txt"
  corpus.write_text("\n\n".join(docs) + "\n")
  return corpus, docs


@pytest.mark.parametrize("model_type,tokenizer_file,copies", [
    ("bpe", "vocab.json", ["vocab.json", "merges.txt"]),
    ("bpe", "tokenizer.json", ["tokenizer.json"]),
    ("wordpiece", "vocab.txt", ["vocab.txt"]),
])
def test_prepare_on_each_kind_records_it_and_its_ids_decode_back(tmp_path, capsys, model_type, tokenizer_file,
                                                                 copies):
  corpus, docs = _text_corpus(tmp_path)
  train_spm.train(Source(str(corpus)), str(tmp_path / "tok"), vocab_size=300, model_type=model_type)
  warned = "gives 75 tokens, fewer than --vocab_size=300; train the model with --config.model.vocab_size=75"
  assert (warned in capsys.readouterr().err) == (model_type == "wordpiece")
  tokenizer_path = str(tmp_path / "tok" / tokenizer_file)
  out = tmp_path / "prepared"
  manifest = prepare(PrepareConfig(str(corpus), tokenizer_path, str(out), num_shards=2, eval_fraction=0.0))
  tokenizer = load_tokenizer(tokenizer_path)
  vocab_size = tokenizer.vocab_size
  assert vocab_size == {"bpe": 300, "wordpiece": 75}[model_type]   # 17 words fill no more WordPiece pieces
  source_files = [tmp_path / "tok" / name for name in copies]
  assert manifest["tokenizer"] == {
      "model": copies[0], "kind": model_type,
      "sha256": tokenizer.sha256, "vocab_size": vocab_size, "do_lower_case": model_type == "wordpiece",
      "files": {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in source_files}}
  for name in copies:
    assert (out / name).read_bytes() == (tmp_path / "tok" / name).read_bytes()
  source = DocumentSource(records.split_files(str(out), manifest, "train"), manifest["token_dtype"])
  decoded = set()
  for i in range(len(source)):
    ids, offsets = source[i]
    decoded.add("\n".join(tokenizer.hf.decode(ids[a:b].tolist()) for a, b in zip(offsets[:-1], offsets[1:])))
  expected = {doc.lower() if model_type == "wordpiece" else doc for doc in docs}
  assert manifest["splits"]["train"]["documents"] == len(docs) and decoded == expected

  data = {"kind": "prepared", "path": str(out), "spm_model": tokenizer_path, "max_seq_length": 32}
  batch = next(make_pretraining_iterator(data, "train", 4, seed=0, process_index=0, process_count=1,
                                       vocab_size=vocab_size))
  assert (batch["input_ids"][:, 0] == tokenizer.cls_id).all() and (batch["input_ids"] == tokenizer.mask_id).any()


# One sentence pair per kind, hand-built: "unaffable is | fine", a word of three pieces and two of one.
HAND_BUILT = {
    "sentencepiece": ["[CLS]", "\u2581un", "aff", "able", "\u2581is", "[SEP]", "\u2581fine", "[SEP]"],
    "wordpiece": ["[CLS]", "un", "##aff", "##able", "is", "[SEP]", "fine", "[SEP]"],
    # RoBERTa's: no "Ġ" on a segment's first word, so "fine" after </s> opens a word by its place alone
    "bpe": ["<s>", "Un", "aff", "able", "\u0120is", "</s>", "fine", "</s>"],
}


@pytest.mark.parametrize("kind", sorted(HAND_BUILT))
def test_whole_word_masking_masks_whole_words_by_each_markers_rule(kind):
  """Single words (ngram 1) under a budget of 3 tokens: "unaffable" (3 pieces) alone, or "is" then "fine"; under a
  budget of 1: "is" or "fine", each a word of one piece (for BPE only because "fine" opens its segment)."""
  pieces = HAND_BUILT[kind]
  ids = np.arange(len(pieces))[None].repeat(200, axis=0)
  ids[:, 5] = len(pieces) - 1   # both separators are the one [SEP] id
  chosen = {}
  for budget in (3, 1):
    masker = Masker(start_piece_table(pieces, kind), cls_id=0, sep_id=len(pieces) - 1, mask_id=0,
                    max_seq_length=len(pieces), max_predictions_per_seq=budget, masked_lm_prob=0.4, ngram=1,
                    segment_starts_word=segment_starts_word(kind))
    masked, _ = masker.select(ids, np.ones_like(ids), np.arange(200, dtype=np.uint64))
    chosen[budget] = {tuple(np.nonzero(row)[0].tolist()) for row in masked}
  assert chosen == {3: {(1, 2, 3), (4, 6)}, 1: {(4,), (6,)}}
  assert start_piece_table(pieces, kind).tolist()[2:5] == [False, False, True]


@pytest.mark.parametrize("model_type,tokenizer_file", [("bpe", "vocab.json"), ("wordpiece", "vocab.txt")])
def test_a_corpus_prepared_with_each_kind_pretrains_and_resumes_exactly(tmp_path, model_type, tokenizer_file):
  """Two steps, then two more from the checkpoint, end with the parameters of four steps run at once."""
  corpus, _ = _text_corpus(tmp_path)
  train_spm.train(Source(str(corpus)), str(tmp_path / "tok"), vocab_size=300, model_type=model_type)
  tokenizer_path = str(tmp_path / "tok" / tokenizer_file)
  prepare(PrepareConfig(str(corpus), tokenizer_path, str(tmp_path / "prepared"), num_shards=2, eval_fraction=0.0))
  argv = ["main", "--config=experiments/pretrain_tiny.py", "--config.data.kind=prepared",
          f"--config.data.path={tmp_path / 'prepared'}",
          f"--config.model.vocab_size={load_tokenizer(tokenizer_path).vocab_size}",
          "--config.model.num_hidden_layers=1", "--config.model.hidden_size=32", "--config.model.embedding_size=16",
          "--config.model.intermediate_size=64", "--config.model.num_attention_heads=2",
          "--config.data.max_seq_length=32", "--config.model.max_position_embeddings=32",
          "--config.train.global_batch_size=8", "--config.train.warmup_steps=1", "--config.train.eval_every=0",
          "--config.checkpoint.every=2", "--config.checkpoint.async_save=False", "--config.log.every=1",
          "--config.train.num_train_steps=4"]
  quietly(pretrain.train, experiment_config(argv), Run(str(tmp_path / "whole")))
  shutil.copytree(tmp_path / "whole", tmp_path / "resumed")  # the run as a stop after step 2's checkpoint leaves it
  shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "4")
  assert "Resumed from step 2" in quietly(pretrain.train, experiment_config(argv), Run(str(tmp_path / "resumed")))
  whole, resumed = final_params(tmp_path / "whole"), final_params(tmp_path / "resumed")
  assert whole[0] == resumed[0] == 4
  assert_trees_equal(whole[1], resumed[1])
  assert logged(tmp_path / "whole")[4] == logged(tmp_path / "resumed")[4]


def test_roberta_tiny_with_bpe_trains_on_the_bundled_corpus_tokenized_by_a_byte_level_bpe(tmp_path):
  """tokenizer=bpe builds the bundled corpus with a 4,000-token byte-level BPE beside its shards, which the run
  records as its tokenizer; the argument is refused for the sizes that train on data of their own."""
  from data_pipeline import tiny
  from experiments import pretrain_roberta
  data = tmp_path / "tiny"
  argv = ["main", "--config=experiments/pretrain_roberta.py:size=tiny,tokenizer=bpe", f"--config.data.path={data}",
          "--config.model.num_hidden_layers=1",
          "--config.train.num_train_steps=2", "--config.train.global_batch_size=8", "--config.train.eval_every=0",
          "--config.checkpoint.every=2", "--config.checkpoint.async_save=False", "--config.log.every=1"]
  quietly(pretrain.train, experiment_config(argv), Run(str(tmp_path / "run")))
  assert final_params(tmp_path / "run")[0] == 2
  manifest = records.read_manifest(tiny.prepared_dir(str(data), "bpe"))
  assert (manifest["tokenizer"]["kind"], manifest["tokenizer"]["vocab_size"]) == ("bpe", tiny.VOCAB_SIZE)
  assert record.recorded_tokenizer(str(tmp_path / "run"))[0] == f"{data}/prepared_bpe/vocab.json"
  assert not (data / "prepared").exists()
  with pytest.raises(InputError, match=r"^Config argument tokenizer=bpe chooses the bundled corpus's tokenizer "
                                       r"\(size=tiny\); size=base trains on data prepared with yours \(train_spm "
                                       r"--model_type=bpe\).$"):
    pretrain_roberta.get_config("size=base,tokenizer=bpe")
