"""Fine-tuning configs: the original recipes, per-size learning rates, the explicit-init rule, flat data keys."""
import pytest

from albert_jax.errors import InputError
from albert_jax.model_config import ModelConfig
from albert_jax.tasks import get_task
from albert_jax.tasks.glue import SPECS
from experiments import common, glue, race, squad_v1, squad_v2

# run_glue.sh (REFERENCE b.6): task -> (warmup, lr, steps, save every, batch)
RUN_GLUE = {"sst-2": (1256, 1e-5, 20935, 100, 32), "mnli": (1000, 3e-5, 10000, 100, 128),
            "cola": (320, 1e-5, 5336, 100, 16), "qnli": (1986, 1e-5, 33112, 200, 32),
            "qqp": (1000, 5e-5, 14000, 100, 128), "rte": (200, 3e-5, 800, 100, 32),
            "sts-b": (214, 2e-5, 3598, 100, 16), "mrpc": (200, 2e-5, 800, 100, 32)}


def _common_checks(c):
  assert c.train.optimizer == "adamw" and c.train.weight_decay == 0.01 and c.train.eps == 1e-6
  assert c.train.clip_grad_norm == 1.0 and c.classifier_dropout_prob == 0.1
  assert c.allow_random_init is False and c.init_checkpoint == ""
  assert c.data.do_lower_case is True
  ModelConfig.from_mapping(c.model)
  get_task(c)


@pytest.mark.parametrize("task", sorted(SPECS))
def test_glue_recipes(task):
  c = glue.get_config(f"task={task},size=base,data=/d/glue,spm=/m/spiece.model")
  _common_checks(c)
  assert c.task == "glue" and c.task_name == task and c.data.max_seq_length == 512
  assert c.data.path == f"/d/glue/{SPECS[task].directory}" and c.data.spm_model == "/m/spiece.model"
  if task in RUN_GLUE:
    warmup, lr, steps, every, batch = RUN_GLUE[task]
    assert (c.train.warmup_steps, c.train.learning_rate, c.train.num_train_steps, c.train.eval_every,
            c.train.global_batch_size) == (warmup, lr, steps, every, batch)
  assert c.checkpoint.every == c.train.eval_every
  if task == "ax":
    assert c.train.num_train_steps == 0
  expected = {"mnli": ("dev", "dev_mismatched"), "ax": ()}.get(task, ("dev",))
  assert get_task(c).eval_splits == expected


def test_per_size_learning_rates_and_dropout():
  lr = lambda arg: glue.get_config(arg).train.learning_rate
  assert lr("task=qqp,size=base") == 5e-5 and lr("task=qqp,size=large_v1") == 5e-5
  assert lr("task=qqp,size=large") == 1e-5 and lr("task=qqp,size=xlarge_v2") == 5e-6
  assert lr("task=cola,size=xlarge") == 5e-6 and lr("task=cola,size=xxlarge") == 1e-5
  assert race.get_config("size=base").train.learning_rate == 1e-5
  assert race.get_config("size=base_v1").train.learning_rate == 2e-5
  assert glue.get_config("task=rte,size=base_v1").model.hidden_dropout_prob == 0.1
  assert glue.get_config("task=rte,size=base").model.hidden_dropout_prob == 0.0


def test_squad_and_race_configs():
  for module, version in ((squad_v1, 1), (squad_v2, 2)):
    c = module.get_config("size=base,data=/d/squad")
    _common_checks(c)
    assert c.task == f"squad_v{version}" and c.data.path == "/d/squad"
    assert (c.data.max_seq_length, c.data.doc_stride, c.data.max_query_length, c.data.max_answer_length,
            c.data.n_best_size) == (384, 128, 64, 30, 20)
    assert c.train.learning_rate == 5e-5 and c.train.global_batch_size == 48
    assert c.train.warmup_steps == c.train.num_train_steps // 10
  assert get_task(squad_v1.get_config()).metric_name == "f1"
  assert get_task(squad_v2.get_config()).metric_name == "best_f1"
  c = race.get_config("size=base,data=/d/race")
  _common_checks(c)
  assert (c.data.max_seq_length, c.data.max_qa_length, c.train.global_batch_size, c.train.num_train_steps,
          c.train.warmup_steps) == (512, 128, 32, 12000, 1000)


# ELECTRA's recipe (its appendix table): steps = ceil(epochs x train examples / 32), by hand:
# CoLA 3 x 8,551 / 32 = 801.7 -> 802; RTE 10 x 2,490 / 32 = 778.1 -> 779; STS-B 10 x 5,749 / 32 = 1,796.6 -> 1,797; ...
ELECTRA_STEPS = {"cola": 802, "sst-2": 6314, "mrpc": 344, "sts-b": 1797, "qqp": 34111, "mnli": 36816,
                 "qnli": 9820, "rte": 779, "wnli": 60}
ELECTRA_SIZES = {"electra_small": (3e-4, 0.8), "electra_base": (1e-4, 0.8), "electra_large": (5e-5, 0.9)}


@pytest.mark.parametrize("task", sorted(ELECTRA_STEPS))
def test_electra_glue_recipes(task):
  assert glue.get_config(f"task={task}").train.layerwise_lr_decay == 0.0  # ALBERT's recipe: off
  steps = ELECTRA_STEPS[task]
  for recipe, (lr, decay) in ELECTRA_SIZES.items():
    c = glue.get_config(f"task={task},size=large,data=/d/glue,recipe={recipe}")  # no ALBERT v2 large cap
    _common_checks(c)
    assert (c.train.learning_rate, c.train.layerwise_lr_decay, c.train.global_batch_size, c.data.max_seq_length,
            c.train.num_train_steps, c.train.warmup_steps) == (lr, decay, 32, 128, steps, steps // 10)
    assert c.train.eval_every == c.checkpoint.every == -(-steps // 10)


def test_electra_squad_recipes():
  for module, version, steps in ((squad_v1, 1, 5475), (squad_v2, 2, 8145)):  # 2 x 87,599 and 2 x 130,319 / 32
    for recipe, (lr, decay) in ELECTRA_SIZES.items():
      c = module.get_config(f"data=/d/squad,recipe={recipe}")
      _common_checks(c)
      assert c.task == f"squad_v{version}"
      assert (c.train.learning_rate, c.train.layerwise_lr_decay, c.train.global_batch_size, c.data.max_seq_length,
              c.train.num_train_steps, c.train.warmup_steps) == (lr, decay, 32, 512, steps, steps // 10)
      assert (c.data.doc_stride, c.data.max_query_length, c.data.max_answer_length) == (128, 64, 30)
  assert squad_v2.get_config("recipe=electra_base,head=answer_class").data.v2_head == "answer_class"


def test_an_unknown_recipe_is_refused():
  for module, arg in ((glue, "task=rte,"), (squad_v1, ""), (squad_v2, ""), (race, "")):
    with pytest.raises(InputError, match=r"^Config argument recipe='electra'; choose one of \['albert', "
                       r"'electra_small', 'electra_base', 'electra_large', 'roberta', 'bert'\]\.$"):
      module.get_config(f"{arg}recipe=electra")


def test_unknown_task_and_args():
  c = glue.get_config("task=rte")
  c.task = "ner"
  with pytest.raises(ValueError, match="Unknown fine-tuning task 'ner'"):
    get_task(c)
  with pytest.raises(ValueError, match="Unknown config argument 'epochs'"):
    glue.get_config("task=rte,epochs=3")
  assert common.finetuning_config("base", "glue", "rte").train.optimizer == "adamw"
