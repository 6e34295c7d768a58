"""ELECTRA's classification head (families/electra_model.ElectraClassifier): chosen by `classifier_head=auto` for
weights of an ELECTRA backbone, recorded with the run; transformers' ElectraForSequenceClassification both ways (logits within
1e-4, the very tensors on a round trip); a fine-tuned ELECTRA run exported as that class. The WordPiece vocab.txt
of the released ELECTRA folders (data_pipeline/wordpiece.py): BERT's ids, carried by convert both ways."""
import json

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from albert_jax import convert, finetune, job_kinds
from albert_jax.errors import InputError
from albert_jax.families.electra import HF_SEQUENCE_CLASSIFICATION as ELECTRA_SEQUENCE_CLASSIFICATION
from albert_jax.families.electra_model import ElectraClassifier
from albert_jax.formats import hf_electra, hf_tokenizer
from albert_jax.model import abstract_params
from albert_jax.model_config import ModelConfig, model_config_from
from albert_jax.run import Run
from albert_jax.tasks import TaskSettings, alignment, get_task
from albert_jax.tasks.heads import PooledClassifier
from albert_jax.weights import record, store
from data_pipeline.wordpiece import WordPieceTokenizer
from experiments import glue
from tests.helpers import config_for, quietly, write_split

# Sizes no other test uses: V=41, E=20, H=28 (E != H), 4 heads of 7, FFN 36, 21 positions, 3 classes.
HF = dict(vocab_size=41, embedding_size=20, hidden_size=28, num_hidden_layers=2, num_attention_heads=4,
          intermediate_size=36, max_position_embeddings=21, hidden_act="gelu", hidden_dropout_prob=0.0,
          attention_probs_dropout_prob=0.0)
LABELS = ["neg", "neu", "pos"]  # not the sorted order of another run: as transformers' id2label names them
IDS = np.array([[2, 17, 5, 40, 9, 3, 0], [2, 8, 33, 3, 11, 3, 0]])
MASK = np.array([[1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1]])
TYPES = np.array([[0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 1, 1, 1]])


def hf_classifier(hf, **overrides):
  """A random ElectraForSequenceClassification whose every weight is random (a swapped tensor shows)."""
  hf.torch.manual_seed(0)
  config = hf.transformers.ElectraConfig(**{**HF, **overrides}, id2label=dict(enumerate(LABELS)),
                                         label2id={name: i for i, name in enumerate(LABELS)})
  model = hf.transformers.ElectraForSequenceClassification(config)
  with hf.torch.no_grad():
    for p in model.parameters():
      p.copy_(hf.torch.randn_like(p) * 0.1)
  return model.eval()


def hf_logits(hf, model, ids=IDS, mask=MASK, types=TYPES):
  return hf.hf_forward(model, ids, mask, types).logits.numpy()


def our_logits(model_config, params, ids=IDS, mask=MASK, types=TYPES):
  model = ElectraClassifier(model_config, params["classifier"]["out_proj"]["bias"].shape[0])
  return np.asarray(model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types)))


@pytest.fixture
def hf():
  from tests import hf_models
  return hf_models


@pytest.mark.hf
def test_electra_for_sequence_classification_converts_both_ways(hf, tmp_path):
  """--from=hf: our logits within 1e-4, its classes and its ELECTRA backbone recorded; --to=hf: the very tensors
  and config fields back; auto picks ELECTRA's head for the converted weights."""
  model = hf_classifier(hf)
  source = hf.saved(model, tmp_path / "hf")
  convert.convert("hf", None, source, str(tmp_path / "ours"))
  model_config, params = store.load_pretrained(str(tmp_path / "ours"))
  assert sorted(params["classifier"]) == ["dense", "out_proj"]
  np.testing.assert_allclose(our_logits(model_config, params), hf_logits(hf, model), atol=1e-4, rtol=0)
  assert json.loads((tmp_path / "ours" / "head.json").read_text()) == {
      "hf_architecture": ELECTRA_SEQUENCE_CLASSIFICATION, "labels": LABELS, "num_labels": 3, "problem_type": None}
  assert record.backbone_family(str(tmp_path / "ours")) == "electra"

  convert.convert(None, "hf", str(tmp_path / "ours"), str(tmp_path / "back"), spm_model=convert.NO_TOKENIZER)
  hf.assert_same_tensors({k: v for k, v in hf.read(source).items() if "position_ids" not in k},
                         hf.read(tmp_path / "back"))
  back = json.loads((tmp_path / "back" / "config.json").read_text())
  assert (back["architectures"], back["id2label"], back["problem_type"]) == (
      [ELECTRA_SEQUENCE_CLASSIFICATION], {"0": "neg", "1": "neu", "2": "pos"}, "single_label_classification")
  # The encoder alone is an ElectraModel, and stays one through --from=hf and --to=hf (backbone.json says ELECTRA).
  none = convert.NO_TOKENIZER
  convert.convert(None, "hf", str(tmp_path / "ours"), str(tmp_path / "encoder"), encoder_only=True, spm_model=none)
  convert.convert("hf", None, str(tmp_path / "encoder"), str(tmp_path / "encoder_ours"))
  convert.convert(None, "hf", str(tmp_path / "encoder_ours"), str(tmp_path / "encoder_back"), spm_model=none)
  assert json.loads((tmp_path / "encoder_back" / "config.json").read_text())["architectures"] == ["ElectraModel"]


@pytest.mark.hf
def test_ours_exports_as_electra_for_sequence_classification_with_our_logits(hf, tmp_path):
  """Random params of our ELECTRA-headed model (a regression: one output, no labels) load into transformers with
  our logits and come back exactly; a head whose task names other classes than it has outputs is refused before anything is written."""
  model_config = ModelConfig(**{k: v for k, v in HF.items() if not k.endswith("dropout_prob")},
                                        sharing="none")
  rng = np.random.RandomState(0)  # every weight random, biases and LayerNorms too
  params = jax.tree.map(lambda x: rng.normal(0, 0.1, x.shape).astype(np.float32),
                        nn.unbox(abstract_params(ElectraClassifier(model_config, 1))))
  folder = hf_electra.save_hf(model_config, params, str(tmp_path / "reg"))[0]
  loaded = hf.transformers.ElectraForSequenceClassification.from_pretrained(folder).eval()
  assert loaded.config.problem_type == "regression" and loaded.num_labels == 1
  np.testing.assert_allclose(hf_logits(hf, loaded), our_logits(model_config, params), atol=1e-4, rtol=0)
  _, back = hf_electra.load_hf(folder)  # every weight exactly, but the pooler, which HF ELECTRA has not
  flat, flat_back = (flax.traverse_util.flatten_dict(tree) for tree in (params, back))
  assert sorted(flat) == sorted(flat_back)
  for path in flat:
    assert path[:2] == ("albert", "pooler") or np.array_equal(flat[path], flat_back[path]), path
  head = hf_electra.HFHead(ELECTRA_SEQUENCE_CLASSIFICATION, ("a", "b"))
  with pytest.raises(InputError, match="ELECTRA's classification head with 1 outputs, but its task names"):
    hf_electra.save_hf(model_config, params, str(tmp_path / "wrong"), head=head)
  assert not (tmp_path / "wrong").exists()


def test_the_head_follows_the_backbone_and_is_recorded(tmp_path):
  """auto: ELECTRA's head for an ELECTRA pretraining run, a fine-tuning run that had it, or converted ELECTRA
  weights; ALBERT's for other weights and none; an explicit choice stays. The task builds and records it."""
  (tmp_path / "electra_run").mkdir()
  (tmp_path / "electra_run" / "config.json").write_text(json.dumps({"task": "electra"}))
  (tmp_path / "finetuned").mkdir()
  (tmp_path / "finetuned" / "config.json").write_text(json.dumps({"task": "glue", "classifier_head": "electra"}))
  (tmp_path / "albert_run").mkdir()
  (tmp_path / "albert_run" / "config.json").write_text(json.dumps({"task": "pretrain"}))
  config = ml_collections.ConfigDict({"classifier_head": "auto"})
  chosen = lambda path, c=config: record.with_classifier_head(c, record.read(path)).classifier_head
  assert [chosen(str(tmp_path / name)) for name in ("electra_run", "finetuned", "albert_run")] == [
      "electra", "electra", "auto"]  # auto: ALBERT's head
  assert record.with_classifier_head(config, None) is config and config.classifier_head == "auto"
  assert chosen(str(tmp_path / "electra_run"), ml_collections.ConfigDict({"classifier_head": "albert"})) == "albert"

  settings = dict(task="classification", path=str(tmp_path), labels=("a", "b"))
  electra, albert, auto = (get_task(TaskSettings(**settings, classifier_head=head))
                           for head in ("electra", "albert", "auto"))
  model_config = ModelConfig(**{k: v for k, v in HF.items() if not k.endswith("dropout_prob")})
  assert isinstance(electra.make_model(model_config), ElectraClassifier)
  assert isinstance(albert.make_model(model_config), PooledClassifier)
  assert isinstance(auto.make_model(model_config), PooledClassifier) and auto.identity() == albert.identity()
  assert electra.identity() == {**albert.identity(), "classifier_head": "electra"}
  assert (electra.hf_head.architecture, albert.hf_head.architecture) == (
      ELECTRA_SEQUENCE_CLASSIFICATION, "AlbertForSequenceClassification")
  with pytest.raises(InputError, match="classifier_head='gpt2'; choose one of auto, albert, electra, bert, roberta"):
    TaskSettings(**settings, classifier_head="gpt2")


def test_describe_says_which_head_and_counts_it(capsys):
  """--mode=describe of GLUE with ELECTRA's head: it says so, and counts H x H + H + H x 2 + 2 head parameters."""
  config = glue.get_config("task=rte,size=tiny")
  config.data.max_seq_length, config.classifier_head = 32, "electra"
  job_kinds.kind_for(config).describe()
  lines = capsys.readouterr().out.splitlines()
  assert "classifier head: ELECTRA's (ElectraClassifier)" in lines
  h = config.model.hidden_size
  assert json.loads(lines[-1])["params_heads"] == h * h + h + h * 2 + 2


# A BERT-style uncased WordPiece vocabulary for the words of `write_split`'s rows, and a few more.
VOCAB = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "good", "great", "fine", "bad", "aw", "##ful",
         "dull", "film", "##s", "!", ",", ".", "'", "cafe", "creme", "1", "##9", "9", "(", ")", "zurich", "the"]
TEXTS = [("A great film!", None), ("Café CRÈME, 1999 (awful) films", "the dull film's Zürich, a fine\tone")]


@pytest.mark.hf
def test_a_wordpiece_vocab_gives_berts_ids(hf, tmp_path):
  """Our WordPiece tokenizer gives transformers' BertTokenizerFast ids, cased and uncased, and each piece's span in
  the original text; a vocabulary without BERT's special tokens is refused."""
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(VOCAB) + "\n")
  for lower in (True, False):
    ours, theirs = WordPieceTokenizer(str(vocab), lower), hf.transformers.BertTokenizerFast(str(vocab),
                                                                                            do_lower_case=lower)
    for first, second in TEXTS:
      assert hf_tokenizer.our_ids(ours, first, second) == (lambda e: (e["input_ids"], e["token_type_ids"]))(
          theirs(first, second))
  uncased = WordPieceTokenizer(str(vocab))
  assert (uncased.encode("Awful films"), ours.encode("Awful films")) == ([11, 12, 14, 15], [2, 14, 15])
  assert ours.vocab_size == len(VOCAB)
  # SQuAD's answer spans: each piece's characters in the original text, accents and capitals included.
  aligned = alignment.align(uncased, "Café  CRÈME, awful")
  assert (aligned.ids, aligned.start.tolist(), aligned.end.tolist()) == (
      [20, 21, 17, 11, 12], [0, 6, 11, 13, 15], [4, 11, 12, 15, 18])
  assert (ours.cls_id, ours.sep_id, ours.pad_id, ours.mask_id) == (3, 4, 0, 5)
  (tmp_path / "bad.txt").write_text("[PAD]\n[UNK]\na\n")
  with pytest.raises(InputError, match="has no \\[CLS\\], \\[SEP\\], \\[MASK\\]; pass a BERT-style vocab.txt"):
    WordPieceTokenizer(str(tmp_path / "bad.txt"))


def fine_tuned_from_a_wordpiece_folder(tmp_path, model_fields: dict, save, **model) -> tuple[str, object, str, str]:
  """A folder as the released ones are (`save(folder)` writes the transformers model, VOCAB its lower-cased
  WordPiece vocab.txt) converted into tmp_path/ours, fine-tuned from there 2 steps on a two-class task into
  tmp_path/run (`model_fields` and `model` the --config.model values), the run exported into tmp_path/export:
  (what convert said, the fine-tuning config, what fine-tuning said, the best weights' folder)."""
  source = tmp_path / "hf"
  save(source)
  (source / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
  (source / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, "model_max_length": 24}))
  converted = quietly(convert.convert, "hf", None, str(source), str(tmp_path / "ours"))
  data = tmp_path / "data"
  data.mkdir()
  write_split(data / "train.tsv", 8)
  write_split(data / "dev.tsv", 4)
  config = config_for(data, str(tmp_path / "ours" / "vocab.txt"))
  config.init_checkpoint, config.allow_random_init = str(tmp_path / "ours"), False
  config.model.update({k: v for k, v in model_fields.items() if not k.endswith("dropout_prob")}, sharing="none",
                      **model)
  config.train.num_train_steps = 2
  said = quietly(finetune.train, config, Run(str(tmp_path / "run")))
  quietly(convert.convert, None, "hf", str(tmp_path / "run"), str(tmp_path / "export"))
  return converted, config, said, json.loads((tmp_path / "run" / "best" / "best.json").read_text())["weights"]


@pytest.mark.hf
@pytest.mark.slow  # a fine-tuning run and two conversions checked through transformers: about 30 s on 2 busy cores
def test_fine_tuning_a_released_style_electra_folder_takes_its_head_and_vocab_and_exports_both(hf, shared_data,
                                                                                               tmp_path):
  """An ElectraForPreTraining folder with a WordPiece vocab.txt, as google's released ones: convert --from=hf
  carries the vocabulary; fine-tuning from it picks ELECTRA's head (said on the console) and tokenizes with it;
  --to=hf of the run is an ElectraForSequenceClassification with the run's classes and logits, and a tokenizer
  that AutoTokenizer loads with the original folder's ids."""
  source = tmp_path / "hf"
  model_fields = {**HF, "vocab_size": len(VOCAB), "max_position_embeddings": 24}
  converted, config, said, best = fine_tuned_from_a_wordpiece_folder(
      tmp_path, model_fields,
      lambda folder: hf.saved(hf.transformers.ElectraForPreTraining(hf.transformers.ElectraConfig(**model_fields)),
                              folder))
  assert "its tokenizer vocab.txt, do_lower_case=True" in converted
  assert record.recorded_tokenizer(str(tmp_path / "ours")) == (str(tmp_path / "ours" / "vocab.txt"), True)
  assert "classifier_head=electra: " in said
  assert json.loads((tmp_path / "run" / "config.json").read_text())["classifier_head"] == "electra"
  assert json.loads((tmp_path / "run" / "head.json").read_text())["classifier_head"] == "electra"
  exported = hf.transformers.ElectraForSequenceClassification.from_pretrained(tmp_path / "export").eval()
  assert exported.config.id2label == {0: "neg", 1: "pos"}
  ids = np.minimum(IDS, len(VOCAB) - 1)
  np.testing.assert_allclose(hf_logits(hf, exported, ids), our_logits(model_config_from(config),
                                                                      store.load_pretrained(best)[1], ids),
                             atol=1e-4, rtol=0)
  original, back = (hf.transformers.AutoTokenizer.from_pretrained(folder) for folder in (source, tmp_path / "export"))
  assert (source / "vocab.txt").read_bytes() == (tmp_path / "export" / "vocab.txt").read_bytes()
  for first, second in TEXTS:
    assert back(first, second)["input_ids"] == original(first, second)["input_ids"]
