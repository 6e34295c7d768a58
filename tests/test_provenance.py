"""What a run is made from (`albert_jax.run.provenance`): the sha256 of its tokenizer, its prepared data's manifest
and its fine-tuning data files, recorded in the run and checked by a resume, a warm start from it and eval on it. A
change is refused in one line naming it and the flag that accepts it; the same bytes under a new mtime are no
change."""
import json
import os
import shutil

import pytest

from albert_jax import finetune, pretrain
from albert_jax.cli import experiment_config
from albert_jax.errors import InputError
from albert_jax.run import Run, provenance
from data_pipeline.prepare import PrepareConfig, prepare
from tests.helpers import prepared_run, quietly, spm, write_split

STEPS = ["--config.train.num_train_steps=2", "--config.train.eval_every=0", "--config.checkpoint.every=2",
         "--config.checkpoint.async_save=False", "--config.train.global_batch_size=8", "--config.train.warmup_steps=1"]


SMALL = ["--config.model.num_hidden_layers=1", "--config.model.hidden_size=32", "--config.model.embedding_size=16",
         "--config.model.intermediate_size=64", "--config.model.num_attention_heads=2"]


def swap_pieces(model: bytes) -> bytes:
  """ALBERT's tokenizer with "▁the" and "▁and" trading places: the same 30000 pieces, two ids exchanged."""
  the, and_ = (b"\x0a\x06" + piece.encode() for piece in ("▁the", "▁and"))  # each piece's field: tag, length
  held = b"\x0a\x06" + "▁·held".encode()[:6]
  assert model.count(the) == model.count(and_) == 1 and held not in model
  return model.replace(the, held).replace(and_, the).replace(held, and_)


def touch(path, text: bytes) -> None:
  """`text` written into `path` and its mtime moved on: a copy or a new checkout."""
  path.write_bytes(text)
  os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))


def one_line(error) -> str:
  return str(error.value)


def test_the_same_bytes_under_a_new_mtime_are_no_change_and_other_bytes_are_named(tmp_path):
  tokenizer = tmp_path / "spiece.model"
  tokenizer.write_bytes(b"pieces")
  before = provenance.fingerprint({"tokenizer": str(tokenizer)})
  touch(tokenizer, b"pieces")
  assert provenance.changes(before, provenance.fingerprint({"tokenizer": str(tokenizer)})) == []
  tokenizer.write_bytes(b"others")
  now = provenance.fingerprint({"tokenizer": str(tokenizer)})
  # sha256("pieces") and sha256("others"), by `sha256sum`
  assert provenance.changes(before, now) == [f"the tokenizer ({tokenizer}: sha256 b6aa423de4f7 then, 01db91d06032 now)"]
  config = experiment_config(["main", "--config=experiments/pretrain_tiny.py"])
  with pytest.raises(InputError) as refused:
    provenance.check("Workdir w", before, now, config, "resume_with_changes")
  assert one_line(refused) == (f"Workdir w was made from other inputs: the tokenizer ({tokenizer}: sha256 b6aa423de4f7 "
                               "then, 01db91d06032 now) changed. Restore them, or pass "
                               "--config.resume_with_changes=True to go on with these.")
  config.resume_with_changes = True
  assert quietly(provenance.check, "Workdir w", before, now, config, "resume_with_changes").endswith(
      "changed; going on with these (resume_with_changes=True).\n")


@pytest.fixture(scope="module")
def pretrained(shared_data, tmp_path_factory):
  """A 2-step pretraining run on a preparation of a book with ALBERT's tokenizer."""
  root = tmp_path_factory.mktemp("pretrained")
  (root / "book.txt").write_text((shared_data / "corpus" / "gutenberg_01952_yellow_wallpaper.txt").read_text()[:30_000])
  prepare(PrepareConfig(input=str(root / "book.txt"), spm_model=str(spm(shared_data)),
                        output_dir=str(root / "prepared"), format="paragraphs", num_shards=2))
  argv = ["main", "--config=experiments/pretrain_tiny.py", *prepared_run(root / "prepared"), *STEPS, *SMALL]
  quietly(pretrain.train, experiment_config(argv), Run(str(root / "run")))
  return root, argv


@pytest.mark.slow
def test_a_swapped_tokenizer_or_a_corpus_prepared_again_is_refused_on_resume_warm_start_and_eval(shared_data,
                                                                                                  pretrained):
  root, argv = pretrained
  run, tokenizer = str(root / "run"), root / "prepared" / json.loads((root / "prepared" / "manifest.json")
                                                                     .read_text())["tokenizer"]["model"]
  recorded = provenance.recorded(Run(run))
  assert set(recorded) == {"tokenizer", "prepared data"}
  assert recorded["tokenizer"] == {"path": str(tokenizer), "sha256": provenance.fingerprints.sha256(str(spm(
      shared_data)))}  # the copy kept with the preparation: ALBERT's own bytes
  original = tokenizer.read_bytes()
  touch(tokenizer, swap_pieces(original))
  swapped = provenance.fingerprint({"tokenizer": str(tokenizer)})["tokenizer"]["sha256"][:12]
  change = f"the tokenizer ({tokenizer}: sha256 {recorded['tokenizer']['sha256'][:12]} then, {swapped} now) changed"
  resumed = experiment_config([*argv, "--config.train.num_train_steps=3"])
  with pytest.raises(InputError) as refused:
    pretrain.train(resumed, Run(run))
  assert one_line(refused) == (f"Workdir {run} was made from other inputs: {change}. Restore them, or pass "
                               "--config.resume_with_changes=True to go on with these.")
  with pytest.raises(InputError) as refused:
    pretrain.evaluate_checkpoint(experiment_config(argv), Run(run))
  assert one_line(refused) == (f"--workdir={run} was made from other inputs: {change}. Restore them, or pass "
                               "--config.accept_changed_inputs=True to go on with these.")
  warm = experiment_config([*argv, f"--config.init_checkpoint={run}"])
  with pytest.raises(InputError, match=rf"^init_checkpoint={run} was made from other inputs: the tokenizer "):
    pretrain.train(warm, Run(str(root / "warm")))
  write_split(root / "train.tsv", 16)
  write_split(root / "dev.tsv", 8)
  fine_tuning = experiment_config(["main", f"--config=experiments/classification.py:size=tiny,data={root},"
                                           f"spm={tokenizer},text=sentence,labels=pos|neg",
                                   f"--config.init_checkpoint={run}", *STEPS])
  with pytest.raises(InputError, match=rf"^init_checkpoint={run} was made from other inputs: the tokenizer "):
    finetune.train(fine_tuning, Run(str(root / "fine_tuned")))
  assert not (root / "warm").exists() and not (root / "fine_tuned").exists()

  touch(tokenizer, original)  # the same bytes, a new mtime: the run goes on (nothing left to train)
  assert "Nothing to train" in quietly(pretrain.train, experiment_config(argv), Run(run))

  again = root / "again"  # the corpus prepared again, with the swapped tokenizer of the same size
  (root / "swapped.model").write_bytes(swap_pieces(original))
  prepare(PrepareConfig(input=str(root / "book.txt"), spm_model=str(root / "swapped.model"), output_dir=str(again),
                        format="paragraphs", num_shards=3))
  shutil.rmtree(root / "prepared")
  shutil.copytree(again, root / "prepared")
  with pytest.raises(InputError, match=rf"^Workdir {run} was made from other inputs: the tokenizer \(.*\); the "
                                       r"prepared data \(.*manifest.json: sha256 \w+ then, \w+ now\) changed\. "):
    pretrain.train(resumed, Run(run))
  with pytest.raises(InputError, match=rf"^--workdir={run} was made from other inputs: the tokenizer .* the prepared "
                                       "data"):
    pretrain.evaluate_checkpoint(experiment_config(argv), Run(run))


def swap_labels(split: bytes) -> bytes:
  return split.replace(b"\tpos\n", b"\tPOS\n").replace(b"\tneg\n", b"\tpos\n").replace(b"\tPOS\n", b"\tneg\n")


@pytest.mark.slow
def test_a_changed_train_file_stops_a_resume_and_a_changed_dev_file_an_eval(shared_data, tmp_path):
  """A resume reads the train file the run recorded; `--mode=eval` the dev file, whose labels give its score: a
  dev file of other bytes is refused unless accept_changed_inputs, which scores against it and says so. Eval reads
  no train file, so a changed one does not stop it."""
  write_split(tmp_path / "train.tsv", 16)
  write_split(tmp_path / "dev.tsv", 8)
  argv = ["main", f"--config=experiments/classification.py:size=tiny,data={tmp_path},spm={spm(shared_data)},"
                  "text=sentence,labels=pos|neg", "--config.allow_random_init=True",
          "--config.data.max_seq_length=16", "--config.model.max_position_embeddings=16",
          "--config.data.length_buckets=none", *STEPS, *SMALL]
  quietly(finetune.train, experiment_config(argv), Run(str(tmp_path / "run")))
  assert set(provenance.recorded(Run(str(tmp_path / "run")))) == {"tokenizer", "train file", "dev file"}
  train = tmp_path / "train.tsv"
  original = train.read_bytes()
  touch(train, swap_labels(original))
  with pytest.raises(InputError, match=rf"^Workdir {tmp_path / 'run'} was made from other inputs: the train file "
                                       rf"\({train}: sha256 \w+ then, \w+ now\) changed\. Restore them, or pass "
                                       r"--config.resume_with_changes=True"):
    finetune.train(experiment_config(argv), Run(str(tmp_path / "run")))

  score = lambda *flags: json.loads(quietly(finetune.evaluate, experiment_config([*argv, *flags]),
                                            Run(str(tmp_path / "run"))).splitlines()[-1])["accuracy"]
  recorded_score = score()  # the train file changed, the dev file not
  dev = tmp_path / "dev.tsv"
  before, dev_bytes = provenance.fingerprints.sha256(str(dev))[:12], dev.read_bytes()
  touch(dev, swap_labels(dev_bytes))
  written = {path: path.stat().st_mtime_ns for path in (tmp_path / "run").rglob("*")}
  with pytest.raises(InputError) as refused:
    finetune.evaluate(experiment_config(argv), Run(str(tmp_path / "run")))
  assert one_line(refused) == (
      f"--workdir={tmp_path / 'run'} was made from other inputs: the dev file ({dev}: sha256 {before} then, "
      f"{provenance.fingerprints.sha256(str(dev))[:12]} now) changed. Restore them, or pass "
      "--config.accept_changed_inputs=True to go on with these.")
  assert {path: path.stat().st_mtime_ns for path in (tmp_path / "run").rglob("*")} == written
  assert score("--config.accept_changed_inputs=True") == pytest.approx(1 - recorded_score)

  touch(train, original)
  touch(dev, dev_bytes)
  assert "Nothing to train" in quietly(finetune.train, experiment_config(argv), Run(str(tmp_path / "run")))


@pytest.mark.slow
def test_the_bundled_tiny_run_records_its_tokenizer_for_warm_starts_and_exports(tiny_prepared, tmp_path):
  """data.kind=tiny records the tokenizer and the preparation it builds in the run's folder. Another SentencePiece
  model of the same size copied over the tokenizer is then refused by a fine-tuning warm start from the run, and by
  `convert --to=hf` of the run and of a run fine-tuned from it before the copy; the same bytes again pass."""
  from albert_jax import convert
  from albert_jax.weights.resolve import resolve
  run = tmp_path / "run"
  shutil.copytree(os.path.dirname(tiny_prepared), run / "tiny_data")  # built already: the run reuses it
  quietly(pretrain.train, experiment_config(["main", "--config=experiments/pretrain_tiny.py", *STEPS, *SMALL]),
          Run(str(run)))
  tokenizer, manifest = (run / "tiny_data" / "prepared" / name for name in ("spiece.model", "manifest.json"))
  assert provenance.recorded(Run(str(run))) == {
      "tokenizer": {"path": str(tokenizer), "sha256": provenance.fingerprints.sha256(str(tokenizer))},
      "prepared data": {"path": str(manifest), "sha256": provenance.fingerprints.sha256(str(manifest))}}
  write_split(tmp_path / "train.tsv", 16)
  write_split(tmp_path / "dev.tsv", 8)
  argv = ["main", f"--config=experiments/classification.py:size=tiny,data={tmp_path},text=sentence,labels=pos|neg",
          f"--config.init_checkpoint={run}", *STEPS]
  fine_tuning = lambda: resolve(str(run), experiment_config(argv), overrides=()).config  # as `main` builds it
  assert fine_tuning().data.spm_model == str(tokenizer)
  quietly(finetune.train, fine_tuning(), Run(str(tmp_path / "tuned")))

  original, before = tokenizer.read_bytes(), provenance.fingerprints.sha256(str(tokenizer))[:12]
  touch(tokenizer, swap_pieces(original))
  now = provenance.fingerprints.sha256(str(tokenizer))[:12]
  change = f"the tokenizer ({tokenizer}: sha256 {before} then, {now} now)"
  with pytest.raises(InputError) as refused:
    finetune.train(fine_tuning(), Run(str(tmp_path / "tuned_after")))
  assert one_line(refused) == (f"init_checkpoint={run} was made from other inputs: {change} changed. Restore them, "
                               "or pass --config.accept_changed_inputs=True to go on with these.")
  for src in (run, tmp_path / "tuned"):
    with pytest.raises(InputError) as refused:
      convert.convert(None, "hf", str(src), str(tmp_path / "hf"))
    assert one_line(refused) == (f"--src={src} was trained with another tokenizer: {change}. Restore it, or pass "
                                 "--spm_model= a copy of the one the run recorded, so that the export gives the "
                                 "model's ids.")
  assert not (tmp_path / "tuned_after").exists() and not (tmp_path / "hf").exists()
  touch(tokenizer, original)
  for src in (run, tmp_path / "tuned"):
    provenance.check_export(Run(str(src)), f"--src={src}", str(tokenizer))
