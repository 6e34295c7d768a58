"""`convert --to=hf` exports the run's tokenizer: transformers' own pipeline on the folder gives our labels and
probabilities, its tokenizer our ids on every text of the shared data, and an export whose tokenizer would give
other ids, or that names none, is refused with nothing written."""
import glob
import json
import re
import shutil
import sys
import types

import flax.linen as nn
import jax
import numpy as np
import pytest
import tokenizers

from albert_jax import convert, finetune, job_kinds
from albert_jax import model as model_lib
from albert_jax.errors import ExistsError, InputError
from albert_jax.formats import hf_tokenizer
from albert_jax.model_config import model_config_from
from albert_jax.run import Run
from albert_jax.tasks.heads import PooledClassifier
from albert_jax.weights import record, store
from data_pipeline import train_spm
from data_pipeline.sources import Source
from data_pipeline.tokenization import Tokenizer
from tests.helpers import config_for, quietly, require_module, spm, write_split

MODEL = dict(vocab_size=30000, embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=64, max_position_embeddings=64)
TEXTS = ["I loved it.", "I hated it!", "A GREAT film, wasn't it?", "Crème brûlée in São Paulo (Brazil)",
         "In 1990, 3,400 people paid $1,628.26."]


@pytest.fixture(scope="module")
def run(shared_data, tmp_path_factory):
  """A fine-tuning workdir as training leaves it (config.json, best/step_3 with random weights: logits of order 1)
  and its export."""
  root = tmp_path_factory.mktemp("hf_export")
  (root / "data").mkdir()
  write_split(root / "data" / "train.tsv", 8)
  write_split(root / "data" / "dev.tsv", 4)
  config = config_for(root / "data", spm(shared_data))
  config.model.update(MODEL)
  config.data.max_seq_length = MODEL["max_position_embeddings"]  # no text of TEXTS cut short
  workdir, step = root / "run", root / "run" / "best" / "step_3"
  model_config = model_config_from(config)
  rng = np.random.RandomState(0)
  params = jax.tree.map(lambda x: (rng.standard_normal(x.shape) * 0.3).astype(np.float32),
                        nn.unbox(model_lib.abstract_params(PooledClassifier(model_config, 2))))
  store.save_pretrained(str(step), model_config, params)
  (workdir / "config.json").write_text(config.to_json_best_effort())
  (workdir / "best" / "best.json").write_text(json.dumps(
      {"step": 3, "metric": "accuracy", "value": 0.5, "weights": str(step),
       "head": {"task": "classification", "task_name": "", "labels": ["neg", "pos"]}}))
  said = quietly(convert.convert, None, "hf", str(workdir), str(root / "hf"))
  return types.SimpleNamespace(root=root, workdir=workdir, config=config, hf=root / "hf", said=said)


def test_a_pipeline_on_the_export_gives_our_labels_and_probabilities(run):
  transformers = require_module("transformers", extra="hf")
  assert "checked to give its ids through" in run.said, run.said
  (run.root / "in.tsv").write_text("sentence\n" + "".join(f"{t}\n" for t in TEXTS))
  args = job_kinds.RunArgs(input=str(run.root / "in.tsv"), output=str(run.root / "out.jsonl"))
  quietly(finetune.predict, run.config, Run(str(run.workdir)), args)
  ours = [json.loads(line) for line in open(run.root / "out.jsonl")]
  theirs = transformers.pipeline("text-classification", model=str(run.hf), top_k=None)(TEXTS)
  assert len({tuple(row["probabilities"].values()) for row in ours}) == len(TEXTS)  # the texts are told apart
  for mine, their in zip(ours, theirs):
    assert their[0]["label"] == mine["label"]
    assert {row["label"]: row["score"] for row in their} == pytest.approx(mine["probabilities"], abs=1e-5)


def test_a_pipeline_with_truncation_takes_a_text_longer_than_the_positions_as_we_do(run):
  """The README's `pipeline(..., truncation=True)`: without it a text longer than the model's positions fails in the
  model (a size mismatch); with it the text is cut where ours is, and the probabilities agree."""
  transformers = require_module("transformers", extra="hf")
  long_text = " ".join(TEXTS * 40)
  (run.root / "long.tsv").write_text(f"sentence\n{long_text}\n")
  args = job_kinds.RunArgs(input=str(run.root / "long.tsv"), output=str(run.root / "long.jsonl"), split="")
  quietly(finetune.predict, run.config, Run(str(run.workdir)), args)
  (mine,) = [json.loads(line) for line in open(run.root / "long.jsonl")]
  classify = transformers.pipeline("text-classification", model=str(run.hf), top_k=None)
  assert len(classify.tokenizer(long_text)["input_ids"]) > classify.model.config.max_position_embeddings
  with pytest.raises(Exception):  # noqa: B017 - torch's own error, a size mismatch in the embeddings
    classify([long_text])
  (theirs,) = classify([long_text], truncation=True)
  assert {row["label"]: row["score"] for row in theirs} == pytest.approx(mine["probabilities"], abs=1e-5)


def _shared_texts(shared_data) -> list[str]:
  """The 14,630 texts hf_tokenizer's docstring counts: 400 lines of 30 corpus books, 299 lines of each GLUE dev set,
  the contexts of SQuAD's first 20 articles."""
  texts = []
  for book in sorted(glob.glob(str(shared_data / "corpus" / "*.txt")))[:30]:
    texts += [line for line in open(book, encoding="utf-8") if line.strip()][:400]
  for dev in sorted(glob.glob(str(shared_data / "glue" / "*" / "dev.tsv"))):
    texts += [line.split("\t")[-1] for line in open(dev, encoding="utf-8")][1:300]
  squad = json.load(open(sorted(glob.glob(str(shared_data / "squad" / "*.json")))[0]))
  return texts + [p["context"] for article in squad["data"][:20] for p in article["paragraphs"]]


@pytest.mark.parametrize("lower", [True, False], ids=["uncased", "cased"])
def test_the_exported_tokenizer_gives_our_ids_on_every_shared_text(shared_data, tmp_path, lower):
  """The tokenizer.json the export writes, as the tokenizers library loads it, cased and uncased; transformers'
  AlbertTokenizer from spiece.model alone differs on parentheses and numbers with commas."""
  ours = Tokenizer(str(shared_data / "albert_spm" / "spiece.model"), lower)
  hf_tokenizer.save_tokenizer(ours, str(tmp_path), 512)
  theirs = tokenizers.Tokenizer.from_file(str(tmp_path / hf_tokenizer.TOKENIZER_FILE))
  texts = _shared_texts(shared_data)
  assert len(texts) == 14630
  differ = [text for text in texts if theirs.encode(text).ids != hf_tokenizer.our_ids(ours, text, None)[0]]
  assert not differ, (len(differ), differ[:3])
  assert json.loads((tmp_path / hf_tokenizer.TOKENIZER_CONFIG).read_text())["do_lower_case"] is lower


def test_transformers_loads_the_export_with_our_ids_and_segments(run, tokenizer):
  transformers = require_module("transformers", extra="hf")
  theirs = transformers.AutoTokenizer.from_pretrained(str(run.hf))
  for first, second in [*((text, None) for text in TEXTS), (TEXTS[0], TEXTS[3])]:
    got = theirs(first, second)
    assert (got["input_ids"], got["token_type_ids"]) == hf_tokenizer.our_ids(tokenizer, first, second)
  assert (run.hf / hf_tokenizer.SPM_FILE).read_bytes() == open(tokenizer.model_path, "rb").read()


def test_an_export_whose_tokenizer_would_give_other_ids_is_refused_with_nothing_written(run, tmp_path, monkeypatch):
  """Digit-comma pieces allowed to win, as a plain conversion of the SentencePiece model allows them."""
  built = hf_tokenizer.hf_tokenizer
  def with_digit_comma_pieces(tokenizer):
    spec = json.loads(built(tokenizer).to_str())
    spec["model"]["vocab"] = [[piece, 0.0 if score < -1e8 else score] for piece, score in spec["model"]["vocab"]]
    return tokenizers.Tokenizer.from_str(json.dumps(spec))
  monkeypatch.setattr(hf_tokenizer, "hf_tokenizer", with_digit_comma_pieces)
  with pytest.raises(InputError, match=r"gives other ids than .*spiece.model for \('In 1990, 3,400 people paid "
                                       r"\$1,628.26 \(or 1.53 percent\).', None\).*nothing was written"):
    quietly(convert.convert, None, "hf", str(run.workdir), str(tmp_path / "hf"))
  assert not (tmp_path / "hf").exists()


def test_weights_that_name_no_tokenizer_are_refused_unless_told_to_export_them_alone(run, shared_data, tmp_path):
  weights = tmp_path / "weights"
  shutil.copytree(run.workdir / "best" / "step_3", weights)
  with pytest.raises(InputError, match=r"names no SentencePiece model .* --spm_model=PATH .* --spm_model=none"):
    quietly(convert.convert, None, "hf", str(weights), str(tmp_path / "a"))
  assert not (tmp_path / "a").exists()
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("\n".join(_shared_texts(shared_data)[:3000]))
  small = train_spm.train(Source(str(corpus)), str(tmp_path / "small.model"), vocab_size=300)
  with pytest.raises(InputError, match=r"small.model has 300 pieces but the model has vocab_size=30000"):
    quietly(convert.convert, None, "hf", str(weights), str(tmp_path / "b"), False, False, small)
  assert not (tmp_path / "b").exists()
  quietly(convert.convert, None, "hf", str(weights), str(tmp_path / "c"), False, False, convert.NO_TOKENIZER)
  assert not (tmp_path / "c" / hf_tokenizer.TOKENIZER_FILE).exists() and (tmp_path / "c" / "config.json").is_file()
  quietly(convert.convert, None, "hf", str(weights), str(tmp_path / "d"), False, False, spm(shared_data))
  assert (tmp_path / "d" / hf_tokenizer.TOKENIZER_FILE).is_file()


# Files an earlier tool left in an export folder, which transformers reads beside ours (issue #48): "hello" taken
# as an added token, and [CLS] and [MASK] swapped.
STALE = {"added_tokens.json": ({"hello": 30000}, "added tokens ['hello']"),
         "special_tokens_map.json": ({"cls_token": "[MASK]", "mask_token": "[CLS]"}, "special tokens {'unk_token': "
                                     "'<unk>', 'pad_token': '<pad>', 'cls_token': '[MASK]'")}


def test_overwrite_removes_the_files_an_earlier_tool_left_and_the_folder_loads_with_our_ids(run, tokenizer, tmp_path):
  transformers = require_module("transformers", extra="hf")
  dst = tmp_path / "hf"
  shutil.copytree(run.hf, dst)
  for name, (content, _) in STALE.items():
    (dst / name).write_text(json.dumps(content))
  (dst / "onnx").mkdir()  # an export of the earlier weights: a folder is the earlier conversion's too
  (dst / "onnx" / "model.onnx").write_text("earlier weights")
  said = quietly(convert.convert, None, "hf", str(run.workdir), str(dst), True)
  assert (f"Removed from --dst={dst} what this conversion does not write: added_tokens.json, onnx, "
          "special_tokens_map.json.") in said
  assert sorted(p.name for p in dst.iterdir()) == sorted(p.name for p in run.hf.iterdir())
  theirs = transformers.AutoTokenizer.from_pretrained(str(dst))
  assert theirs("I said hello")["input_ids"] == hf_tokenizer.our_ids(tokenizer, "I said hello", None)[0]
  assert (theirs.cls_token_id, theirs.mask_token_id) == (tokenizer.cls_id, tokenizer.mask_id) == (2, 4)


@pytest.mark.parametrize("name", STALE)
def test_the_closing_check_loads_every_file_of_the_folder_as_transformers_does(run, tokenizer, tmp_path, name):
  require_module("transformers", extra="hf")
  shutil.copytree(run.hf, tmp_path / "hf")
  assert hf_tokenizer.check_loaded(tokenizer, str(tmp_path / "hf"), "fix") == "TokenizersBackend"
  content, found = STALE[name]
  (tmp_path / "hf" / name).write_text(json.dumps(content))
  with pytest.raises(InputError, match="^" + re.escape(f"{tmp_path / 'hf'}: transformers loads the tokenizer with "
                                                       f"{found}")):
    hf_tokenizer.check_loaded(tokenizer, str(tmp_path / "hf"), "fix")


def test_overwrite_of_a_folder_that_holds_no_model_is_refused_and_removes_nothing(run, tmp_path):
  dst = tmp_path / "mine"
  dst.mkdir()
  (dst / "notes.txt").write_text("mine")
  with pytest.raises(ExistsError, match="^" + re.escape(f"--dst={dst} holds notes.txt but no model (config.json, "
                                                        "model_config.json, params); --overwrite replaces an earlier "
                                                        "conversion, not other files")):
    quietly(convert.convert, None, "hf", str(run.workdir), str(dst), True)
  assert [p.name for p in dst.iterdir()] == ["notes.txt"]


def test_without_transformers_the_export_is_checked_through_the_tokenizers_library(tokenizer, monkeypatch):
  """`convert` needs only the base install (tests/test_install.py); the check then loads tokenizer.json itself."""
  monkeypatch.setitem(sys.modules, "transformers", None)
  assert hf_tokenizer.check_tokenizer(tokenizer, tokenizer.vocab_size, 512) == "Tokenizer"


def test_a_hugging_face_folder_converted_here_and_back_keeps_its_tokenizer(shared_data, tmp_path):
  """`--from=hf` carries spiece.model and do_lower_case (False here, unlike the default): a fine-tuning run from the
  import takes them, and `--to=hf` of it needs no --spm_model and gives the original folder's ids."""
  from tests.hf_models import hf_model, saved, transformers
  original = saved(hf_model(**MODEL), tmp_path / "original")
  shutil.copy(spm(shared_data), tmp_path / "original")
  transformers.AlbertTokenizer.from_pretrained(original, do_lower_case=False).save_pretrained(original)
  ours, back = str(tmp_path / "ours"), str(tmp_path / "back")
  said = quietly(convert.convert, "hf", None, original, ours)
  assert said.rstrip().endswith("its tokenizer spiece.model, do_lower_case=False)."), said
  assert record.recorded_tokenizer(ours) == (f"{ours}/spiece.model", False)
  config, taken = record.take_recorded(config_for(tmp_path, ""), record.read(ours), explicit=())
  assert (config.data.spm_model, config.data.do_lower_case) == (f"{ours}/spiece.model", False), taken
  assert "checked to give its ids through" in quietly(convert.convert, None, "hf", ours, back)
  texts = [("A GREAT film, wasn't it?", None), ("Does Zoë live in São Paulo?", "She moved to Zürich last year.")]
  before, after = (transformers.AutoTokenizer.from_pretrained(folder) for folder in (original, back))
  for first, second in texts:
    assert after(first, second)["input_ids"] == before(first, second)["input_ids"], first
  assert before(*texts[0])["input_ids"] != before(texts[0][0].lower())["input_ids"]  # the case kept


def test_a_hugging_face_folder_without_spiece_model_is_converted_saying_what_runs_from_it_need(tmp_path):
  from tests.hf_models import hf_model, saved
  ours = str(tmp_path / "ours")
  said = quietly(convert.convert, "hf", None, saved(hf_model(), tmp_path / "original"), ours)
  assert "no tokenizer: " in said and "need data.spm_model and --to=hf needs --spm_model" in said, said
  assert record.recorded_tokenizer(ours) is None


def test_every_exported_file_is_readable_by_others(run):
  modes = {path.name: path.stat().st_mode & 0o777 for path in run.hf.iterdir()}
  assert modes["model.safetensors"] == 0o644, modes  # safetensors alone creates its file 0600
  assert set(modes.values()) == {modes["config.json"]}, modes  # the others: the umask's (0644 under 022)
