"""Sources and preparation: formats, bad input, sharding, determinism, resumption, manifest."""
import json
import re
import os

import numpy as np
import pytest

from data_pipeline import records
from data_pipeline.loader import DocumentSource
from data_pipeline.prepare import PrepareConfig, main as prepare_main, prepare
from data_pipeline.sentences import split_sentences
from data_pipeline.sources import Source
from tests.data_fixtures import albert_tokenizer

pytestmark = pytest.mark.shared_data


def _spm(shared_data):
  return str(shared_data / "albert_spm" / "spiece.model")


def _documents(path, split="train"):
  manifest = records.read_manifest(path)
  source = DocumentSource(records.split_files(path, manifest, split), manifest["token_dtype"])
  return [source[i] for i in range(len(source))]


def test_sentence_splitter():
  assert split_sentences("Mr. Darcy came in. \u201cWell!\u201d said she. See e.g. Ch. 3 at 5 p.m. No.") == [
      "Mr. Darcy came in.", "\u201cWell!\u201d said she.", "See e.g. Ch. 3 at 5 p.m.", "No."]
  assert split_sentences("J. R. R. Tolkien wrote it? Yes.\n") == ["J. R. R. Tolkien wrote it?", "Yes."]
  assert split_sentences("  ") == []


def test_text_formats_stream_documents(tmp_path):
  lines = tmp_path / "a.txt"
  lines.write_text("First one.\nSecond one.\n\n\nOther doc.\n")
  assert [d.units for d in Source(str(lines)).documents()] == [["First one.", "Second one."], ["Other doc."]]
  raw = tmp_path / "b.txt"
  raw.write_text("CHAPTER I.\n\n\nA para\ngraph. Two.\n\nMore.\n\nEnd.\n\n\n\nNext chapter.\n")
  docs = [d.units for d in Source(str(raw), format="paragraphs").documents()]
  assert docs == [["CHAPTER I.", "A para graph. Two.", "More.", "End."], ["Next chapter."]]
  jsonl = tmp_path / "c.jsonl"
  jsonl.write_text('{"text": "Hello there. Bye.\\nNew paragraph."}\nnot json\n{"other": 1}\n')
  docs = list(Source(str(jsonl), format="jsonl").documents())
  assert docs[0].units == ["Hello there. Bye.", "New paragraph."] and [d.unreadable for d in docs] == [0, 1, 1]
  with pytest.raises(FileNotFoundError, match="matches no file"):
    Source(str(tmp_path / "missing*.txt")).files()


def test_tfds_text_dataset_without_tensorflow(shared_data, tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")
  corpus = (shared_data / "corpus" / "gutenberg_01952_yellow_wallpaper.txt").read_text(encoding="utf-8")
  chunks = [c for c in corpus.split("\n\n\n") if c.strip()][:12]

  class TinyText(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({"text": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
      return {"train": self._generate_examples()}

    def _generate_examples(self):
      for i, chunk in enumerate(chunks):
        yield i, {"text": chunk}

  # tfds 4.9.10 locates a builder's code via importlib_resources (not installed) when its module is inside a
  # package; a top-level module name skips that lookup.
  TinyText.__module__ = "tiny_text_builder"
  TinyText(data_dir=str(tmp_path / "tfds"), file_format="array_record").download_and_prepare()
  out = tmp_path / "out"
  manifest = prepare(PrepareConfig(input="tfds:tiny_text:train", tfds_data_dir=str(tmp_path / "tfds"),
                                   spm_model=_spm(shared_data), output_dir=str(out), num_shards=2, eval_fraction=0))
  assert manifest["splits"]["train"]["documents"] == len(chunks)
  tokenizer = albert_tokenizer(shared_data)
  first_sentences = {tuple(ids[:offsets[1]]) for ids, offsets in _documents(str(out))}
  # A TFDS/JSONL text is split into paragraphs at newlines (these books are hard-wrapped: one line each).
  expected = {tuple(tokenizer.encode(split_sentences(c.strip().split("\n")[0])[0])) for c in chunks}
  assert first_sentences == expected
  with pytest.raises(ValueError, match="array_record"):
    prepare(PrepareConfig(input="tfds:no_such_dataset", tfds_data_dir=str(tmp_path / "tfds"),
                          spm_model=_spm(shared_data), output_dir=str(tmp_path / "o2")))


def test_ids_round_trip_and_workers_do_not_change_the_output(shared_data, tmp_path):
  books = str(shared_data / "corpus" / "gutenberg_000[14]*.txt")
  outs = []
  for workers in (1, 2):
    out = tmp_path / f"w{workers}"
    prepare_main([f"--input={books}", "--format=paragraphs", f"--spm_model={_spm(shared_data)}",
                  f"--output_dir={out}", "--num_shards=3", f"--workers={workers}", "--eval_fraction=0.2"])
    outs.append(out)
  for name in sorted(os.listdir(outs[0])):
    if name.endswith(".array_record"):
      assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
  manifest = json.loads((outs[0] / "manifest.json").read_text())
  assert manifest["tokenizer"]["sha256"] == albert_tokenizer(shared_data).sha256
  assert manifest["config"]["num_shards"] == 3 and manifest["config"]["seed"] == 0
  n_train, n_eval = manifest["splits"]["train"]["documents"], manifest["splits"]["eval"]["documents"]
  assert n_train + n_eval == manifest["totals"]["documents"] and 0.1 < n_eval / (n_train + n_eval) < 0.3
  docs = _documents(str(outs[0])) + _documents(str(outs[0]), "eval")
  assert sum(len(ids) for ids, _ in docs) == manifest["totals"]["tokens"]
  assert sum(len(o) - 1 for _, o in docs) == manifest["totals"]["sentences"]
  # The first document of the first book, tokenized directly, is stored exactly.
  tokenizer = albert_tokenizer(shared_data)
  first = next(Source(str(shared_data / "corpus" / "gutenberg_00011_alice_in_wonderland.txt"),
                      format="paragraphs").documents())
  expected = [tokenizer.encode(s) for p in first.units for s in split_sentences(p)]
  stored = [d for d in docs if len(d[1]) - 1 == len(expected) and np.array_equal(d[0][:d[1][1]], expected[0])]
  assert len(stored) == 1 and np.array_equal(stored[0][0], np.concatenate(expected))


def test_resume_after_a_crash_redoes_only_unfinished_shards(shared_data, tmp_path):
  config = PrepareConfig(input=str(shared_data / "corpus" / "gutenberg_00041_legend_of_sleepy_hollow.txt"),
                         format="paragraphs", spm_model=_spm(shared_data), output_dir=str(tmp_path), num_shards=3)
  prepare(config)
  done = tmp_path / records.shard_name("train", 0, 3)
  reference = {p.name: p.read_bytes() for p in tmp_path.glob("*.array_record")}
  # A crash: shard 1 never renamed (left as .tmp), the manifest not yet written.
  lost = tmp_path / records.shard_name("train", 1, 3)
  os.replace(lost, str(lost) + ".tmp")
  (tmp_path / "manifest.json").unlink()
  before = done.stat().st_mtime_ns
  prepare(config)
  assert done.stat().st_mtime_ns == before                      # finished shard not rewritten
  assert {p.name: p.read_bytes() for p in tmp_path.glob("*.array_record")} == reference
  with pytest.raises(ValueError, match="different settings.*seed"):
    prepare(PrepareConfig(**{**config.__dict__, "seed": 1}))


def test_bad_input_is_counted_or_rejected(shared_data, tmp_path):
  data = tmp_path / "in"
  data.mkdir()
  (data / "empty.txt").write_bytes(b"")
  text = (shared_data / "corpus" / "gutenberg_01080_modest_proposal.txt").read_bytes()
  (data / "mixed.txt").write_bytes(b"Only sentence here.\n\n\n\nBad \xff\xfe bytes.\nAnd more.\n\n" +
                                    b"word " * 2_000_000 + b"\n\n" + re.sub(rb"\n+", b"\n", text)[:5000] + b"\n")
  manifest = prepare(PrepareConfig(input=str(data / "*.txt"), spm_model=_spm(shared_data),
                                   output_dir=str(tmp_path / "out"), num_shards=2, eval_fraction=0))
  totals = manifest["totals"]
  assert totals["empty_files"] == 1 and totals["non_utf8_lines"] == 1 and totals["single_sentence_documents"] == 1
  assert totals["documents"] == 4 and totals["long_sentences_split"] == 1      # the 10 MB line: 2M tokens, cut
  longest = max(len(ids) for ids, _ in _documents(str(tmp_path / "out")))
  assert longest == 2_000_000
  (data / "docs.jsonl").write_text('{"text": ""}\n{"text": " \\u0301 "}\n[1]\n{"text": "One. Two."}\n')
  totals = prepare(PrepareConfig(input=str(data / "docs.jsonl"), format="jsonl", spm_model=_spm(shared_data),
                                 output_dir=str(tmp_path / "out_jsonl"), num_shards=1, eval_fraction=0))["totals"]
  assert totals["empty_documents_skipped"] == 2 and totals["unreadable_records"] == 1 and totals["documents"] == 1
  with pytest.raises(ValueError, match="No documents"):
    prepare(PrepareConfig(input=str(data / "empty.txt"), spm_model=_spm(shared_data),
                          output_dir=str(tmp_path / "o2")))
  with pytest.raises(FileNotFoundError, match="train_spm"):
    prepare(PrepareConfig(input=str(data / "mixed.txt"), spm_model=str(tmp_path / "nope.model"),
                          output_dir=str(tmp_path / "o3")))
