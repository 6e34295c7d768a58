"""Sources and preparation: formats, bad input, sharding, determinism, resumption, manifest; a file named by several
paths read once; the same preparation run again changes no byte (new mtimes on the same bytes included), so
pretraining on it resumes."""
import hashlib
import json
import re
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import data_pipeline.prepare as prepare_lib
from data_pipeline import fingerprints, records
from albert_jax.errors import InputError
from data_pipeline.loader import DocumentSource
from data_pipeline.prepare import PrepareConfig, main as prepare_main, prepare
from data_pipeline.sentences import split_sentences
from data_pipeline.sources import Source
from tests.data_fixtures import albert_tokenizer
from tests.helpers import REPO, TEXT, logged, prepared_run, pretrain_cli, require_module

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
  with pytest.raises(InputError, match="matches no file"):
    Source(str(tmp_path / "missing*.txt")).files()


def test_tfds_text_dataset_without_tensorflow(shared_data, tmp_path, capsys):
  tfds = require_module("tensorflow_datasets")   # a dependency of the base install
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
  config = PrepareConfig(input="tfds:tiny_text:train", tfds_data_dir=str(tmp_path / "tfds"),
                         spm_model=_spm(shared_data), output_dir=str(out), num_shards=2, eval_fraction=0)
  manifest = prepare(config)
  assert manifest["splits"]["train"]["documents"] == len(chunks) and manifest["input_files"] >= 3
  tokenizer = albert_tokenizer(shared_data)
  first_sentences = {tuple(ids[:offsets[1]]) for ids, offsets in _documents(str(out))}
  # A TFDS/JSONL text is split into paragraphs at newlines (these books are hard-wrapped: one line each).
  expected = {tuple(tokenizer.encode(split_sentences(c.strip().split("\n")[0])[0])) for c in chunks}
  assert first_sentences == expected
  # The dataset rebuilt with other content under the same name: its files' fingerprints say so, and it is prepared
  # again rather than the old shards reused.
  shutil.rmtree(tmp_path / "tfds")
  chunks = chunks[:1]
  TinyText(data_dir=str(tmp_path / "tfds"), file_format="array_record").download_and_prepare()
  capsys.readouterr()
  assert prepare(config)["splits"]["train"]["documents"] == 1
  assert "input file(s) changed" in capsys.readouterr().err
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


def test_shards_beyond_the_open_file_limit_are_refused_before_anything_is_written(shared_data, tmp_path,
                                                                                  monkeypatch):
  """Each worker holds all its shards open: 100,000 ended in "Too many open files" part way (issue #48)."""
  monkeypatch.setattr(prepare_lib.resource, "getrlimit", lambda kind: (1024, 4096))
  settings = dict(input=str(tmp_path / "in.txt"), spm_model=_spm(shared_data), output_dir=str(tmp_path / "out"))
  with pytest.raises(InputError) as refused:
    PrepareConfig(**settings, num_shards=100_000)
  assert str(refused.value) == ("--num_shards=100000 and --num_eval_shards=1 over --workers=1 make a worker hold "
                                "100,001 shard files open at once, beyond this process's limit of 1,024 open files "
                                "(ulimit -n): use at most --num_shards=959 with these workers, more --workers, or "
                                "raise ulimit -n.")
  PrepareConfig(**settings, num_shards=959)
  PrepareConfig(**settings, num_shards=1919, workers=2)
  with pytest.raises(InputError, match="use at most --num_shards=1,919 with these workers"):
    PrepareConfig(**settings, num_shards=1920, workers=2)
  assert not (tmp_path / "out").exists()


def test_a_corpus_mostly_not_utf8_or_of_one_sentence_documents_is_warned_of(shared_data, tmp_path, capsys):
  """Both prepared with only a count, then pretrained on <unk>s, or SOP at chance (issue #48)."""
  latin = "".join(f"Caf\u00e9 num\u00e9ro {i} est ouvert. Il ferme t\u00f4t.\n" for i in range(8))
  (tmp_path / "latin1.txt").write_bytes(latin.encode("latin-1") + "A line in UTF-8. And another.\n".encode())
  prepare(PrepareConfig(input=str(tmp_path / "latin1.txt"), spm_model=_spm(shared_data),
                        output_dir=str(tmp_path / "a"), num_shards=1, eval_fraction=0))
  err = capsys.readouterr().err
  assert ("data_pipeline.prepare: warning: 8 of 9 lines hold bytes that are not UTF-8, read as U+FFFD (which "
          "tokenizes to <unk>): the corpus is likely in another encoding; convert it (e.g. iconv -f latin1 -t "
          "utf-8) and prepare again.\n") in err and "one sentence" not in err
  (tmp_path / "single.txt").write_text("".join(f"Sentence number {i} stands alone.\n\n" for i in range(5))
                                       + "Two sentences,\none a line.\n\n")
  prepare(PrepareConfig(input=str(tmp_path / "single.txt"), spm_model=_spm(shared_data),
                        output_dir=str(tmp_path / "b"), num_shards=1, eval_fraction=0))
  err = capsys.readouterr().err
  assert ("data_pipeline.prepare: warning: 5 of 6 documents hold one sentence: sentence-order prediction pairs two "
          "segments of one document, so it cannot learn from these; keep each document's sentences together (one "
          "per line) with a blank line between documents.\n") in err and "UTF-8" not in err


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
  # The 10 MB line: read in 10 pieces of at most 1 MiB, cut at spaces (9 cuts), so no word changes: 2M tokens.
  assert totals["documents"] == 4 and totals["lines_cut"] == 9 and totals["long_sentences_split"] == 10
  longest = max(len(ids) for ids, _ in _documents(str(tmp_path / "out")))
  assert longest == 2_000_000
  (data / "docs.jsonl").write_text('{"text": ""}\n{"text": " \\u0301 "}\n[1]\n{"text": "One. Two."}\n')
  totals = prepare(PrepareConfig(input=str(data / "docs.jsonl"), format="jsonl", spm_model=_spm(shared_data),
                                 output_dir=str(tmp_path / "out_jsonl"), num_shards=1, eval_fraction=0))["totals"]
  assert totals["empty_documents_skipped"] == 2 and totals["unreadable_records"] == 1 and totals["documents"] == 1
  with pytest.raises(ValueError, match="No documents"):
    prepare(PrepareConfig(input=str(data / "empty.txt"), spm_model=_spm(shared_data),
                          output_dir=str(tmp_path / "o2")))
  with pytest.raises(InputError, match="train_spm"):
    prepare(PrepareConfig(input=str(data / "mixed.txt"), spm_model=str(tmp_path / "nope.model"),
                          output_dir=str(tmp_path / "o3")))


def _swapped_model(shared_data, path):
  """ALBERT's model with the pieces '▁the' and '▁of' swapped: a valid tokenizer whose ids mean other words."""
  from sentencepiece import sentencepiece_model_pb2
  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString((shared_data / "albert_spm" / "spiece.model").read_bytes())
  index = {p.piece: i for i, p in enumerate(proto.pieces)}
  a, b = proto.pieces[index["\u2581the"]], proto.pieces[index["\u2581of"]]
  a.piece, b.piece = b.piece, a.piece
  path.write_bytes(proto.SerializeToString())
  return str(path)


def _stored_sentences(path):
  return [ids[o[i]:o[i + 1]].tolist() for ids, o in _documents(str(path)) for i in range(len(o) - 1)]


def test_rerun_after_the_corpus_or_tokenizer_changed_prepares_again(shared_data, tmp_path, capsys):
  from data_pipeline.loader import make_pretraining_iterator
  from data_pipeline.tokenization import Tokenizer
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("The end of the story.\nIt was the best of times.\n\nA second document.\nOf all things.\n")
  spm = tmp_path / "spm.model"
  spm.write_bytes((shared_data / "albert_spm" / "spiece.model").read_bytes())
  out = tmp_path / "out"
  config = PrepareConfig(input=str(corpus), spm_model=str(spm), output_dir=str(out), num_shards=1, eval_fraction=0)
  assert prepare(config)["totals"]["documents"] == 2
  # The corpus edited in place (same flags): the old shards are deleted and the new text prepared.
  corpus.write_text(corpus.read_text() + "\nA third one, added later.\n")
  manifest = prepare(config)
  assert manifest["totals"]["documents"] == 3 and manifest["inputs"][0]["size"] == corpus.stat().st_size
  said = capsys.readouterr().err.splitlines()
  changed = (f"data_pipeline.prepare: 1 input file(s) changed, e.g. {corpus} since the preparation in {str(out)!r}; "
             "deleting its shards and preparing again.")
  assert changed in said and said[said.index(changed) + 1].startswith("data_pipeline.prepare: 1 input file(s), ")
  # The tokenizer replaced in place: prepared again with it, and the manifest names its hash.
  swapped = Tokenizer(_swapped_model(shared_data, spm))
  manifest = prepare(config)
  assert capsys.readouterr().err.startswith(f"data_pipeline.prepare: --spm_model {spm} changed (sha256) since")
  assert manifest["tokenizer"]["sha256"] == swapped.sha256 != albert_tokenizer(shared_data).sha256
  lines = [s for s in corpus.read_text().split("\n") if s]
  assert _stored_sentences(out) == [swapped.encode(s) for s in lines]
  assert _stored_sentences(out) != [albert_tokenizer(shared_data).encode(s) for s in lines]
  prepare(config)   # nothing changed: nothing rewritten, nothing said but that eval_fraction=0 holds out nothing
  said = capsys.readouterr().err.splitlines()
  assert len(said) == 1 and said[0].startswith("data_pipeline.prepare: warning: no document went to the eval split")
  # The loader refuses shards made with another tokenizer than the model's.
  data = {"kind": "prepared", "path": str(out), "spm_model": _spm(shared_data)}
  with pytest.raises(ValueError) as error:
    make_pretraining_iterator(data, "train", 8, 0, 0, 1, vocab_size=30000)
  assert str(error.value) == (
      f"The shards in {out} were tokenized with {out}/spiece.model, not with data.spm_model={_spm(shared_data)} "
      "(sha256 differs); prepare the data with that model (python -m data_pipeline.prepare --spm_model=...) or "
      "point data.spm_model at the shards' one.")


def test_binary_input_and_a_non_sentencepiece_model_are_refused_by_name(shared_data, tmp_path):
  import gzip
  text = b"A sentence of text.\n" * 100_000          # 2 MB: the NUL below is in neither sampled MiB
  archive = tmp_path / "corpus.txt.gz"
  archive.write_bytes(gzip.compress(text, mtime=0))
  config = PrepareConfig(input=str(archive), spm_model=_spm(shared_data), output_dir=str(tmp_path / "o"))
  with pytest.raises(ValueError) as error:
    prepare(config)
  assert str(error.value) == (f"--input file {archive} is binary (a NUL byte at offset 3); pass text files "
                              "(decompress .gz/.bz2/.zst first) or remove it from --input.")
  middle = tmp_path / "middle.txt"
  middle.write_bytes(text[:1_000_000] + b"\0" + text[1_000_000:])
  with pytest.raises(ValueError, match=rf"^--input file {middle} is binary \(a NUL byte at offset 1000000\)"):
    prepare(PrepareConfig(input=str(middle), spm_model=_spm(shared_data), output_dir=str(tmp_path / "o2")))
  vocab = tmp_path / "spiece.vocab"
  vocab.write_text("<pad>\t0\n<unk>\t0\n\u2581the\t-3.1\n")
  with pytest.raises(ValueError) as error:
    prepare(PrepareConfig(input=str(middle), spm_model=str(vocab), output_dir=str(tmp_path / "o3")))
  assert str(error.value) == (f"{vocab} is not a SentencePiece model (it does not parse as one); pass the .model "
                              "file that spm_train writes (not the .vocab), e.g. ALBERT's spiece.model.")


def test_a_huge_line_is_read_in_bounded_pieces(tmp_path):
  import tracemalloc
  line = "word " * 4_000_000 + "end"                  # 20 MB, no newline anywhere
  (tmp_path / "one_line.txt").write_text(line)
  tracemalloc.start()
  docs = list(Source(str(tmp_path / "one_line.txt"), max_document_units=4, max_unit_bytes=1 << 16).documents())
  peak = tracemalloc.get_traced_memory()[1] - sum(len(u) + 49 for d in docs for u in d.units)
  tracemalloc.stop()
  assert peak < 1_000_000                              # beyond what is returned: about one piece, not the line
  units = [u for d in docs for u in d.units]
  assert "".join(units) == line and max(map(len, units)) <= 1 << 16 and len(units) == 306
  assert [len(d.units) for d in docs] == [4] * 76 + [2] and [d.cut for d in docs] == [False] + [True] * 76
  assert sum(d.lines_cut for d in docs) == 305
  # A paragraph of many short lines is cut the same way.
  (tmp_path / "paragraph.txt").write_text("many short words\n" * 10_000)
  docs = list(Source(str(tmp_path / "paragraph.txt"), format="paragraphs", max_unit_bytes=1000).documents())
  assert len(docs) == 1 and [len(u) for u in docs[0].units] == [63 * 17 - 1] * 158 + [46 * 17 - 1]   # 63 lines
  assert docs[0].lines_cut == 158


def test_nothing_is_written_through_a_symlink_in_the_output_folder(shared_data, tmp_path):
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("One sentence.\nTwo sentences.\n")
  out = tmp_path / "out"
  out.mkdir()
  victims = {}
  shard = records.shard_name("train", 0, 1)
  for name in (shard, shard + ".tmp", shard + ".stats.json.tmp", "spiece.model", "spiece.model.tmp",
               "manifest.json.tmp", "prepare_config.json.tmp"):
    victim = tmp_path / f"victim_{name}"
    victim.write_text("keep me")
    (out / name).symlink_to(victim)
    victims[name] = victim
  manifest = prepare(PrepareConfig(input=str(corpus), spm_model=_spm(shared_data), output_dir=str(out),
                                   num_shards=1, eval_fraction=0))
  assert manifest["totals"]["documents"] == 1
  assert all(v.read_text() == "keep me" for v in victims.values())
  assert not any(p.is_symlink() for p in out.iterdir())
  assert (out / "spiece.model").read_bytes() == (shared_data / "albert_spm" / "spiece.model").read_bytes()
  tokenizer = albert_tokenizer(shared_data)
  assert _stored_sentences(out) == [tokenizer.encode("One sentence."), tokenizer.encode("Two sentences.")]


def _children(pid):
  kids = []
  for stat in os.listdir("/proc"):
    try:
      fields = open(f"/proc/{stat}/stat").read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
      continue
    if stat.isdigit() and int(fields[1]) == pid:
      kids.append(int(stat))
  return kids


def _alive(pid):
  try:
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
  except OSError:
    return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads process parents from /proc")
def test_kill_9_of_the_parent_ends_its_workers(shared_data, tmp_path):
  import signal
  import subprocess
  import sys
  import time
  out = tmp_path / "out"
  parent = subprocess.Popen([sys.executable, "-m", "data_pipeline.prepare", f"--input={shared_data / 'corpus'}/*",
                             "--format=paragraphs", f"--spm_model={_spm(shared_data)}", f"--output_dir={out}",
                             "--num_shards=2", "--num_eval_shards=1", "--workers=2"])
  deadline = time.time() + 60
  while len(list(out.glob("*.array_record.tmp"))) < 2 and time.time() < deadline:   # both workers writing
    time.sleep(0.1)
  workers = [p for p in _children(parent.pid) if "spawn_main" in open(f"/proc/{p}/cmdline").read()]
  assert len(workers) == 2
  parent.send_signal(signal.SIGKILL)
  parent.wait()
  deadline = time.time() + 10
  while any(map(_alive, workers)) and time.time() < deadline:
    time.sleep(0.1)
  assert not any(map(_alive, workers))
  assert not list(out.glob("*.array_record"))         # no orphan finished (renamed) a shard


def test_document_positions_measure_the_input_read(tmp_path):
  """Progress and ETA come from `RawDocument.position`: bytes read over all files, ending at their total size."""
  first, second = tmp_path / "a.txt", tmp_path / "b.txt"
  first.write_text("One.\nTwo.\n\nThree.\n")
  second.write_text("Four.\n\nFive six.\n")
  source = Source(f"{first},{second}")
  assert source.total() == (first.stat().st_size + second.stat().st_size, "bytes") == (35, "bytes")
  # Each document ends at its blank line or its file's end: 5+5+1, 18 (a.txt), 18+6+1, 35 (both).
  assert [d.position for d in source.documents()] == [11, 18, 25, 35]


def test_progress_line_says_how_much_is_read_and_the_time_left(capsys, monkeypatch):
  from data_pipeline import progress
  line = progress.Progress("prep", "documents read", (1_200_000, "bytes"), bar=False)
  assert line.status(100, 300_000, 5.0) == "100 documents read (20/s), 25% of 1.2 MB, 15 s left"
  assert line.status(100, None, 5.0) == "100 documents read (20/s)"
  assert progress.duration(3725) == "1 h 02 min" and progress.duration(185) == "3 min 05 s"
  assert progress.amount(4096, "records") == "4,096 records" and progress.amount(999, "bytes") == "999 B"
  clock = iter([0.0, 11.0, 12.0, 30.0])
  monkeypatch.setattr(progress.time, "time", lambda: next(clock))
  ticking = progress.Progress("prep", "documents read", (1000, "bytes"), bar=False)
  ticking.update(10, 250)   # 11 s after the start: a line
  ticking.update(20, 300)   # 1 s after that line: none
  ticking.done()
  assert capsys.readouterr().err.splitlines() == [
      "prep: 10 documents read (1/s), 25% of 1.0 kB, 33 s left", "prep: 20 documents read in 30 s"]


def test_prepare_on_a_terminal_draws_a_bar(shared_data, tmp_path, capsys, monkeypatch):
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("".join(f"Sentence {i} of a document.\nAnd its second line.\n\n" for i in range(300)))
  monkeypatch.setattr("sys.stderr.isatty", lambda: True, raising=False)
  prepare(PrepareConfig(input=str(corpus), spm_model=_spm(shared_data), output_dir=str(tmp_path / "out"),
                        num_shards=2, eval_fraction=0.0))
  err = capsys.readouterr().err
  assert "100%|" in err and f"{corpus.stat().st_size / 1e3:.1f}k/{corpus.stat().st_size / 1e3:.1f}k" in err
  assert "data_pipeline.prepare: 300 documents read in" in err


def _files(folder: Path) -> dict[str, bytes]:
  return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_rerun_or_another_worker_count_writes_the_same_manifest_and_shards(shared_data, tmp_path, capsys):
  book = shared_data / "corpus" / "gutenberg_00041_legend_of_sleepy_hollow.txt"
  flags = [f"--input={book}", "--format=paragraphs", f"--spm_model={_spm(shared_data)}", "--num_shards=3",
           "--eval_fraction=0.2"]
  prepare_main([*flags, f"--output_dir={tmp_path / 'one'}"])
  assert "seconds" in json.loads(capsys.readouterr().out)   # the time taken is told, not recorded
  first = _files(tmp_path / "one")
  assert "seconds" not in json.loads(first["manifest.json"])
  prepare_main([*flags, f"--output_dir={tmp_path / 'one'}"])   # the same command again: nothing to do
  assert _files(tmp_path / "one") == first
  prepare_main([*flags, f"--output_dir={tmp_path / 'two'}", "--workers=2"])
  assert _files(tmp_path / "two") == first


def test_new_mtimes_on_the_same_bytes_reuse_the_preparation_and_its_manifest(shared_data, tmp_path, capsys,
                                                                              monkeypatch):
  """A corpus copied or checked out again (new mtimes, same bytes) is not prepared again, and manifest.json keeps
  its bytes; an edit the cheap fingerprint misses (same size, same first and last bytes) is found by the sha256 of
  the whole file."""
  monkeypatch.setattr(fingerprints, "SAMPLE_BYTES", 8)   # so that a mid-file edit escapes the sampled ends
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("The end of the story.\nIt was the best of times.\n\nA second document.\nOf all things.\n")
  out = tmp_path / "out"
  config = PrepareConfig(input=str(corpus), spm_model=_spm(shared_data), output_dir=str(out), num_shards=1,
                         eval_fraction=0)
  assert prepare(config)["inputs"] == [{"path": str(corpus), "size": corpus.stat().st_size,
                                        "sha256": hashlib.sha256(corpus.read_bytes()).hexdigest()}]
  first = _files(out)
  later = corpus.stat().st_mtime_ns + 10**9
  os.utime(corpus, ns=(later, later))
  capsys.readouterr()
  prepare(config)
  said = capsys.readouterr().err.splitlines()
  assert said[0] == (f"data_pipeline.prepare: 1 input file(s) have new mtimes but the same contents (sha256) as "
                     f"when {str(out)!r} was prepared; reusing it.")
  recorded = _files(out)
  assert recorded.pop("prepare_config.json") != first.pop("prepare_config.json") and recorded == first
  record = json.loads((out / "prepare_config.json").read_text())
  assert record["inputs"][0]["mtime_ns"] == later   # the next run compares the cheap fingerprint only
  # A preparation recorded before contents were hashed (no sha256; the manifest held the cheap fingerprints):
  # reused while the cheap fingerprint is as recorded, its manifest kept as it is, the record completed.
  for entry in record["inputs"]:
    del entry["sha256"]
  (out / "prepare_config.json").write_text(json.dumps(record))
  legacy = {**json.loads(first["manifest.json"]), "inputs": record["inputs"]}
  (out / "manifest.json").write_text(json.dumps(legacy, indent=1))
  prepare(config)
  assert (out / "manifest.json").read_text() == json.dumps(legacy, indent=1)
  assert "sha256" in json.loads((out / "prepare_config.json").read_text())["inputs"][0]
  assert not [line for line in capsys.readouterr().err.splitlines() if "eval split" not in line]
  # The same size and ends, another middle: the whole file's hash differs, so it is prepared again.
  corpus.write_text(corpus.read_text().replace("best", "rest"))
  assert prepare(config)["inputs"][0]["sha256"] == hashlib.sha256(corpus.read_bytes()).hexdigest()
  assert "1 input file(s) changed, e.g." in capsys.readouterr().err
  assert _stored_sentences(out)[1] == albert_tokenizer(shared_data).encode("It was the rest of times.")


def _prepare(text: Path, output_dir: Path, spm_model: str) -> None:
  result = subprocess.run([sys.executable, "-m", "data_pipeline.prepare", f"--input={text}", "--format=paragraphs",
                           f"--spm_model={spm_model}", f"--output_dir={output_dir}"], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
  assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_pretraining_resumes_after_the_same_preparation_is_run_again(shared_data, tmp_path):
  """The checkpoint holds manifest.json's sha256: the same preparation run again, over the same bytes with a new
  mtime, leaves the file as it was, and the run resumes on it. Both launches compile fast (XLA's -O0): no value
  is compared."""
  text = tmp_path / "book.txt"
  text.write_text((shared_data / "corpus" / "gutenberg_01952_yellow_wallpaper.txt").read_text()[:60_000])
  data = tmp_path / "prepared"
  run = [*prepared_run(data), "--config.train.eval_every=0", "--config.checkpoint.every=2"]
  tiny = "experiments/pretrain_tiny.py"
  _prepare(text, data, _spm(shared_data))
  first = pretrain_cli(tmp_path / "run", *run, "--config.train.num_train_steps=2", config=tiny, fast_compile=True)
  assert first.returncode == 0, first.stderr
  os.utime(text, ns=(text.stat().st_atime_ns, text.stat().st_mtime_ns + 10**9))   # as a copy or a new checkout
  _prepare(text, data, _spm(shared_data))
  resumed = pretrain_cli(tmp_path / "run", *run, "--config.train.num_train_steps=3", config=tiny, fast_compile=True)
  assert resumed.returncode == 0, resumed.stderr
  assert logged(tmp_path / "run").keys() == {1, 2, 3}


def test_a_file_named_by_several_paths_or_globs_is_read_once(shared_data, tmp_path, capsys):
  (tmp_path / "a.txt").write_text(TEXT)
  (tmp_path / "b.txt").write_text(TEXT.replace("Document", "Page"))
  (tmp_path / "link.txt").symlink_to(tmp_path / "b.txt")
  spec = f"{tmp_path}/a.txt,{tmp_path}/*.txt,{tmp_path}/./a.txt"
  assert Source(spec).files() == [f"{tmp_path}/a.txt", f"{tmp_path}/b.txt"]
  manifest = prepare(PrepareConfig(input=spec, spm_model=_spm(shared_data), output_dir=str(tmp_path / "out"),
                                   eval_fraction=0.2))
  assert manifest["input_files"] == 2 and manifest["totals"]["documents"] == 40
  assert ("data_pipeline.prepare: dropped 3 repeated --input file(s), named by more than one path or glob; each "
          "file is read once.") in capsys.readouterr().err.splitlines()
