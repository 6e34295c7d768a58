"""Tokenizers as Hugging Face folders keep them: a transformers-5 folder (ALBERT's, ELECTRA's) whose only tokenizer
file is tokenizer.json is converted, fine-tuned from and exported back with transformers' own ids; weights trained
with a byte-level BPE or a WordPiece vocabulary export a tokenizer that transformers loads with our ids, in the
tokenizer's pair layout; a RoBERTa tokenizer's fine-tuning inputs (GLUE, SQuAD, RACE) take RoBERTa's layout."""
import json
import shutil
from pathlib import Path

import jax
import pytest

from albert_jax import convert, finetune
from albert_jax import model as model_lib
from albert_jax.cli import experiment_config
from albert_jax.errors import InputError
from albert_jax.formats.hf_tokenizer import our_ids
from albert_jax.model_config import ModelConfig
from albert_jax.run import Run
from albert_jax.tasks import get_task, make_tokenizer
from albert_jax.weights import record, store
from data_pipeline import pair_layout, train_spm
from data_pipeline.wordpiece import load_tokenizer
from tests.helpers import glue_data, quietly, rte_pairs

pytestmark = [pytest.mark.shared_data, pytest.mark.hf]

ALBERT = dict(vocab_size=30000, embedding_size=16, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
              intermediate_size=64, max_position_embeddings=128)
STEPS = ["--config.train.num_train_steps=2", "--config.train.eval_every=2", "--config.checkpoint.every=2",
         "--config.checkpoint.async_save=False", "--config.train.global_batch_size=8", "--config.train.warmup_steps=1",
         "--config.data.max_seq_length=128"]


@pytest.fixture(scope="module")
def albert_folder(shared_data, tmp_path_factory):
  """A random ALBERT saved by transformers 5 with the tokenizer it builds from our spiece.model: tokenizer.json and
  tokenizer_config.json, no spiece.model."""
  from tests.hf_models import hf_model, saved, transformers
  folder = saved(hf_model(**ALBERT), tmp_path_factory.mktemp("albert") / "hf")
  transformers.AlbertTokenizer.from_pretrained(shared_data / "albert_spm").save_pretrained(folder)
  return folder


def test_a_folder_with_tokenizer_json_alone_is_converted_and_fine_tuned_with_transformers_ids(
    albert_folder, shared_data, tmp_path):
  from tests.hf_models import transformers
  assert not (Path(albert_folder) / "spiece.model").exists()
  ours = str(tmp_path / "ours")
  said = quietly(convert.convert, "hf", None, albert_folder, ours)
  assert said.rstrip().endswith("its tokenizer tokenizer.json, do_lower_case=True)."), said
  assert record.recorded_tokenizer(ours) == (f"{ours}/tokenizer.json", True)

  root = glue_data(shared_data, "rte", tmp_path / "glue")
  argv = ["main", f"--config=experiments/glue.py:task=rte,size=tiny,data={root}", f"--config.init_checkpoint={ours}",
          *STEPS]
  config, taken = record.take_recorded(experiment_config(argv), record.read(ours), explicit=("data.max_seq_length",))
  assert config.data.spm_model == f"{ours}/tokenizer.json", taken
  theirs = transformers.AutoTokenizer.from_pretrained(albert_folder)
  task = get_task(config)
  features, _ = task.featurize(task.read_examples(f"{root}/RTE/dev.tsv", True), make_tokenizer(config))
  compared = 0
  for row, (first, second, _) in enumerate(rte_pairs(shared_data, len(features["input_ids"]))):
    expected = theirs(first, second, return_token_type_ids=True)
    length = len(expected["input_ids"])
    if length <= 128:  # no truncation to tell apart
      assert features["input_ids"][row][:length].tolist() == expected["input_ids"], first
      assert features["token_type_ids"][row][:length].tolist() == expected["token_type_ids"], first
      assert features["attention_mask"][row].sum() == length
      compared += 1
  assert compared >= 15

  back = str(tmp_path / "back")
  assert "checked to give its ids through" in quietly(convert.convert, None, "hf", ours, back)
  again = transformers.AutoTokenizer.from_pretrained(back)
  for first, second, _ in rte_pairs(shared_data, 8):
    assert again(first, second)["input_ids"] == theirs(first, second)["input_ids"], first

  finetune.train(config, Run(str(tmp_path / "run")))
  best = json.loads((tmp_path / "run" / "best" / "best.json").read_text())
  assert best["step"] == 2
  recorded = json.loads((tmp_path / "run" / "config.json").read_text())["data"]["spm_model"]
  assert recorded == f"{ours}/tokenizer.json"


def _squad_texts(shared_data, count):
  """The first `count` (question, context) pairs of the shared SQuAD v1.1 dev set."""
  article = json.loads((shared_data / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))["data"][0]
  return [(qa["question"], paragraph["context"]) for paragraph in article["paragraphs"]
          for qa in paragraph["qas"]][:count]


@pytest.fixture(scope="module")
def trained(shared_data, tmp_path_factory):
  """{kind: folder} of a byte-level BPE and a WordPiece vocabulary trained on a book's first 2,000 lines."""
  root = tmp_path_factory.mktemp("trained")
  lines = (shared_data / "corpus" / "gutenberg_00035_time_machine.txt").read_text(encoding="utf-8").splitlines()
  (root / "corpus.txt").write_text("\n".join(lines[:2000]) + "\n", encoding="utf-8")
  for kind, size in (("bpe", 600), ("wordpiece", 500)):
    train_spm.main([f"--input={root / 'corpus.txt'}", f"--output={root / kind}", f"--model_type={kind}",
                    f"--vocab_size={size}"])
  return {"bpe": root / "bpe" / "vocab.json", "wordpiece": root / "wordpiece" / "vocab.txt"}


@pytest.mark.parametrize("kind,layout,types", [("bpe", pair_layout.ROBERTA, False),
                                               ("wordpiece", pair_layout.BERT, True)])
def test_weights_trained_with_bpe_or_wordpiece_export_a_tokenizer_transformers_loads_with_our_ids(
    trained, shared_data, tmp_path, kind, layout, types):
  """The tokenizer beside the weights (as a run records it) goes to tokenizer.json and tokenizer_config.json:
  transformers' AutoTokenizer gives our fine-tuning inputs (ids, and token types where the layout has them) on GLUE
  pairs, SQuAD questions with their contexts and single texts."""
  from tests.hf_models import transformers
  tokenizer = load_tokenizer(str(trained[kind]))
  assert tokenizer.pair_layout == layout
  model_config = ModelConfig(vocab_size=tokenizer.vocab_size, embedding_size=16, hidden_size=32, num_hidden_layers=1,
                             num_attention_heads=4, intermediate_size=64, max_position_embeddings=512)
  backbone = model_lib.init_params(model_lib.AlbertModel(model_config), jax.random.key(0))
  ours, exported = tmp_path / "ours", str(tmp_path / "hf")
  store.save_pretrained(str(ours), model_config, {"albert": backbone})
  for path in tokenizer.files:
    shutil.copy(path, ours)
  said = quietly(convert.convert, None, "hf", str(ours), exported)
  assert "checked to give its ids through" in said, said
  theirs = transformers.AutoTokenizer.from_pretrained(exported)
  pairs = [(a, b) for a, b, _ in rte_pairs(shared_data, 40)] + _squad_texts(shared_data, 40)
  for first, second in pairs + [(a, None) for a, _ in pairs[:10]]:
    encoded = theirs(first, second, return_token_type_ids=True)
    assert (encoded["input_ids"], encoded["token_type_ids"]) == our_ids(tokenizer, first, second), first
  first, second = pairs[0]
  encoded = theirs(first, second)
  assert ("token_type_ids" in encoded) == types
  sep = [tokenizer.sep_id] * layout.separators_between
  start = 1 + len(tokenizer.encode(first))
  assert encoded["input_ids"][start:start + len(sep) + 1] == [*sep, tokenizer.encode(second)[0]]


def test_fine_tuning_inputs_of_a_roberta_tokenizer_take_its_pair_layout(trained, shared_data, tmp_path):
  """GLUE pairs are `<s> A </s></s> B </s>` in segment 0, cut to max_seq_length counting the four special tokens;
  SQuAD's context starts after both separators, its answers' spans still its tokens; RACE's article is cut to leave
  room for all four; SQuAD v2's answer-class head, which finds the context by its segment, is refused."""
  from tests.helpers import squad_data, squad_task, task_of
  from albert_jax.tasks.race import RaceExample, qa_text
  from experiments import glue, race
  tokenizer = load_tokenizer(str(trained["bpe"]))
  root = glue_data(shared_data, "rte", tmp_path / "glue")
  task, width = task_of(glue, f"task=rte,size=tiny,data={root}", max_seq_length=80), 80
  examples = task.read_examples(f"{root}/RTE/dev.tsv", True)
  features, _ = task.featurize(examples, tokenizer)
  assert not features["token_type_ids"].any()
  whole = 0
  for row, (first, second, _) in enumerate(rte_pairs(shared_data, len(examples))):
    ids, _ = our_ids(tokenizer, first, second)
    length = features["attention_mask"][row].sum()
    if len(ids) <= width:
      assert features["input_ids"][row][:length].tolist() == ids
      whole += 1
    else:
      kept = features["input_ids"][row].tolist()
      assert length == width and kept[0] == tokenizer.cls_id and kept[-1] == tokenizer.sep_id
      assert [kept[i:i + 2] for i in range(width - 1)].count([tokenizer.sep_id] * 2) == 1
  assert 0 < whole < len(examples)

  squad = squad_task(1, squad_data(shared_data, tmp_path / "squad", 1), max_seq_length=96, doc_stride=32)
  examples = squad.read_examples(squad.split_path("train"))
  features, info = squad.featurize(examples, tokenizer)
  answered = 0
  for row, (start, end) in enumerate(zip(features["start_positions"], features["end_positions"])):
    example = examples[info["example_index"][row]]
    query = len(tokenizer.encode(example.question)[:squad.settings.max_query_length])
    assert features["input_ids"][row][query + 1:query + 3].tolist() == [tokenizer.sep_id] * 2
    assert info["token_start_char"][row][query + 2] == -1 and info["token_start_char"][row][query + 3] >= 0
    if start:
      span = example.context[info["token_start_char"][row][start]:info["token_end_char"][row][end]]
      assert span.strip() == example.answers[0].strip(), (span, example.answers[0])
      answered += 1
  assert answered >= 10

  choice = task_of(race, "", max_seq_length=32, max_qa_length=16)
  example = RaceExample("x-0", "", "first words " * 50, "which one " * 80 + "_ ?", ["a", "b", "c", "d"], 1)
  features, _ = choice.featurize([example], tokenizer)
  qa = tokenizer.encode(qa_text(example.question, "a"))[-16:]
  article = tokenizer.encode(example.article)[:32 - 4 - 16]
  assert features["input_ids"][0, 0].tolist() == [tokenizer.cls_id, *article, *[tokenizer.sep_id] * 2, *qa,
                                                  tokenizer.sep_id]
  assert features["attention_mask"].all() and not features["token_type_ids"].any()

  v2 = squad_task(2, squad_data(shared_data, tmp_path / "squad2", 2), v2_head="answer_class")
  with pytest.raises(InputError, match=r"^data.v2_head='answer_class' tells the context from the question by its "
                                       r"token type, which the roberta pair layout of .*vocab.json leaves 0; use "
                                       r"data.v2_head='null_score'.$"):
    v2.featurize(v2.read_examples(v2.split_path("train")), tokenizer)


def test_an_electra_folder_with_tokenizer_json_alone_is_read_as_it_is(trained, shared_data, tmp_path):
  """Every family's folder is read so: transformers 5 saves ELECTRA's WordPiece tokenizer as tokenizer.json alone;
  converted, its weights record it, our ids are AutoTokenizer's, and the export back gives them too."""
  from tests.hf_models import transformers
  vocab = str(trained["wordpiece"])
  size = load_tokenizer(vocab).vocab_size
  original = str(tmp_path / "original")
  transformers.ElectraForPreTraining(transformers.ElectraConfig(
      vocab_size=size, embedding_size=16, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
      intermediate_size=64, max_position_embeddings=512)).save_pretrained(original)
  transformers.ElectraTokenizer.from_pretrained(str(trained["wordpiece"].parent)).save_pretrained(original)
  assert not (Path(original) / "vocab.txt").exists()
  ours, back = str(tmp_path / "ours"), str(tmp_path / "back")
  assert "its tokenizer tokenizer.json" in quietly(convert.convert, "hf", None, original, ours)
  path, _ = record.recorded_tokenizer(ours)
  tokenizer = load_tokenizer(path)
  assert (path, tokenizer.kind, tokenizer.pair_layout) == (f"{ours}/tokenizer.json", "wordpiece", pair_layout.BERT)
  quietly(convert.convert, None, "hf", ours, back)
  theirs, again = (transformers.AutoTokenizer.from_pretrained(folder) for folder in (original, back))
  for first, second, _ in rte_pairs(shared_data, 20):
    expected = theirs(first, second, return_token_type_ids=True)
    assert our_ids(tokenizer, first, second) == (expected["input_ids"], expected["token_type_ids"]), first
    assert again(first, second)["input_ids"] == expected["input_ids"], first
