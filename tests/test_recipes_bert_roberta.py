"""RoBERTa's and BERT's fine-tuning recipes (`recipe=roberta|bert`): each task's schedule against a hand computation,
the refusal of a task a paper gives no figures for, and the optimiser built from a recipe's config against a
hand-computed AdamW, and a tiny run on RoBERTa's recipe recording those settings."""
import json

import jax
import numpy as np
import pytest

from albert_jax import optim
from albert_jax.errors import InputError
from experiments import glue, race, squad_v1, squad_v2
from tests.helpers import TINY_RUN, finetune_cli, glue_data, spm

# RoBERTa's GLUE: steps = ceil(10 epochs x train rows / batch), warmup = 6% of them rounded down, dev every tenth
# (rounded up). By hand: MNLI 10 x 392,702 / 32 = 122,719.4 -> 122,720, 6% = 7,363.2 -> 7,363; RTE 10 x 2,490 / 16 =
# 1,556.25 -> 1,557, 6% = 93.4 -> 93. fairseq's README.glue.md lists its own counts (e.g. CoLA 5,336 / 320, SST-2
# 20,935 / 1,256), from its binarised data; these are the train files' rows.
# task: (learning_rate, batch, steps, warmup, eval_every)
ROBERTA_GLUE = {"mnli": (1e-5, 32, 122720, 7363, 12272), "qnli": (1e-5, 32, 32733, 1963, 3274),
                "qqp": (1e-5, 32, 113702, 6822, 11371), "sst-2": (1e-5, 32, 21047, 1262, 2105),
                "rte": (2e-5, 16, 1557, 93, 156), "sts-b": (2e-5, 16, 3594, 215, 360),
                "mrpc": (1e-5, 16, 2293, 137, 230), "cola": (1e-5, 16, 5345, 320, 535)}
# (b2, weight_decay, adam_bias_correction, clip_grad_norm)
FAIRSEQ_ADAM, FAIRSEQ_ADAM_SQUAD, BERT_ADAM = (0.98, 0.1, True, 0.0), (0.98, 0.01, True, 0.0), (0.999, 0.01, False, 1.0)


def schedule(c):
  return (c.train.learning_rate, c.train.global_batch_size, c.train.num_train_steps, c.train.warmup_steps,
          c.train.eval_every)


def optimiser(c):
  assert (c.train.optimizer, c.train.b1, c.train.eps, c.train.layerwise_lr_decay) == ("adamw", 0.9, 1e-6, 0.0)
  return c.train.b2, c.train.weight_decay, c.train.adam_bias_correction, c.train.clip_grad_norm


@pytest.mark.parametrize("task", sorted(ROBERTA_GLUE))
def test_roberta_glue_recipe(task):
  c = glue.get_config(f"task={task},size=large,recipe=roberta")  # no ALBERT v2 large cap on the rate
  assert schedule(c) == ROBERTA_GLUE[task] and c.checkpoint.every == c.train.eval_every
  assert optimiser(c) == FAIRSEQ_ADAM and c.data.max_seq_length == 512


def test_bert_glue_recipe():
  # 3 x 2,490 / 32 = 233.4 -> 234, warmup 23.4 -> 23; 3 x 392,702 / 32 = 36,815.8 -> 36,816, warmup 3,681
  for task, expected in (("rte", (2e-5, 32, 234, 23, 24)), ("mnli", (2e-5, 32, 36816, 3681, 3682)),
                         ("cola", (2e-5, 32, 802, 80, 81))):
    c = glue.get_config(f"task={task},recipe=bert")
    assert schedule(c) == expected and optimiser(c) == BERT_ADAM and c.data.max_seq_length == 128


def test_squad_recipes():
  # BERT: 2 x 87,599 / 12 = 14,599.8 -> 14,600; 2 x 130,319 / 12 = 21,719.8 -> 21,720. RoBERTa: at batch 48, 3,650
  # and 5,430; warmup 10% and 6% of them.
  for module, recipe, expected, adam in (
      (squad_v1, "bert", (3e-5, 12, 14600, 1460, 1460), BERT_ADAM),
      (squad_v2, "bert", (3e-5, 12, 21720, 2172, 2172), BERT_ADAM),
      (squad_v1, "roberta", (1.5e-5, 48, 3650, 219, 365), FAIRSEQ_ADAM_SQUAD),
      (squad_v2, "roberta", (1.5e-5, 48, 5430, 325, 543), FAIRSEQ_ADAM_SQUAD)):
    c = module.get_config(f"data=/d/squad,recipe={recipe}")
    assert schedule(c) == expected and optimiser(c) == adam
    assert (c.data.max_seq_length, c.data.doc_stride, c.data.null_score_diff_threshold) == (384, 128, 0.0)


def test_roberta_race_recipe():
  c = race.get_config("data=/d/race,recipe=roberta")
  # 4 x 87,866 / 16 = 21,966.5 -> 21,967, warmup 6% = 1,318; base fine-tunes 8192 tokens a device: 4 x 512 each
  assert schedule(c) == (1e-5, 16, 21967, 1318, 2197) and optimiser(c) == FAIRSEQ_ADAM
  assert (c.data.max_seq_length, c.data.max_qa_length, c.train.max_micro_batch_size) == (512, 128, 4)
  assert race.get_config("data=/d/race").train.num_train_steps == 12000  # ALBERT's stays the default


@pytest.mark.parametrize("module, arg, covering", [
    (glue, "task=wnli,recipe=roberta", "'electra_small', 'electra_base', 'electra_large'"),
    (glue, "task=wnli,recipe=bert", "'electra_small', 'electra_base', 'electra_large'"),
    (race, "recipe=bert", "'roberta'"),
    (race, "recipe=electra_base", "'roberta'")])
def test_a_task_without_published_figures_is_refused(module, arg, covering):
  recipe, task = arg.split("recipe=")[1], "wnli" if "wnli" in arg else "race"
  with pytest.raises(InputError, match=(rf"^Config argument recipe={recipe} has no published figures for {task}; "
                                        rf"choose one of \['albert', {covering}\]\.$")):
    module.get_config(arg)


def hand_adamw_updates(train, params, grads, decayed):
  """The updates of `train`'s AdamW step by step in float64: gradients clipped to global norm clip_grad_norm (0: not
  clipped), moments m, v (bias-corrected by 1 - β^t when asked), u = m / (√v + ε) + wd · p where decayed,
  -lr_t · u with lr_t = lr · t / warmup from t = 0 (steps within the warmup)."""
  assert len(grads) <= train.warmup_steps
  m = {k: 0.0 for k in params}
  v = {k: 0.0 for k in params}
  for t, g in enumerate(grads):
    g = {k: x.astype(np.float64) for k, x in g.items()}
    norm = np.sqrt(sum(np.sum(x ** 2) for x in g.values()))
    if 0 < train.clip_grad_norm < norm:
      g = {k: x * train.clip_grad_norm / norm for k, x in g.items()}
    lr = train.learning_rate * t / train.warmup_steps
    updates = {}
    for k in params:
      m[k] = train.b1 * m[k] + (1 - train.b1) * g[k]
      v[k] = train.b2 * v[k] + (1 - train.b2) * g[k] ** 2
      m_hat, v_hat = (m[k] / (1 - train.b1 ** (t + 1)), v[k] / (1 - train.b2 ** (t + 1))) \
          if train.adam_bias_correction else (m[k], v[k])
      decay = train.weight_decay * params[k][t] if decayed[k] else 0.0
      updates[k] = -lr * (m_hat / (np.sqrt(v_hat) + train.eps) + decay)
    yield updates


@pytest.mark.parametrize("arg", ["task=rte,recipe=roberta", "task=rte,recipe=bert"])
def test_a_recipes_optimiser_settings_reach_the_optimiser(arg):
  """Three steps of the optimiser built from the recipe's train section equal AdamW by hand with the recipe's β2,
  weight decay, bias correction and clipping (every gradient here has a global norm above 1, so clipping
  at 1 changes every step)."""
  train = glue.get_config(arg).train
  tx, _ = optim.create_optimizer(train)
  rng = np.random.default_rng(0)
  params = {"dense": {"kernel": rng.normal(size=(3, 4)).astype(np.float32), "bias": rng.normal(size=4).astype(
      np.float32)}, "LayerNorm": {"scale": rng.normal(size=4).astype(np.float32)}}
  decayed = {"dense/kernel": True, "dense/bias": False, "LayerNorm/scale": False}
  grads = [jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32) * scale, params) for scale in (1, 3, 0.5)]
  state, seen = tx.init(params), {k: [] for k in decayed}
  got = []
  for g in grads:
    for k, x in flat(params).items():
      seen[k].append(x.astype(np.float64))
    updates, state = tx.update(g, state, params)
    got.append(flat(updates))
    params = jax.tree.map(lambda p, u: p + u, params, updates)
  expected = hand_adamw_updates(train, seen, [flat(g) for g in grads], decayed)
  for step, (ours, theirs) in enumerate(zip(got, expected)):
    for k in decayed:
      np.testing.assert_allclose(ours[k], theirs[k], rtol=2e-5, atol=0, err_msg=f"step {step}, {k}")
  assert not np.any(got[0]["dense/kernel"]) and np.all(got[1]["dense/kernel"])  # warmup's rate is 0 at step 0


def flat(tree):
  return {"/".join(k.key for k in path): np.asarray(x) for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


@pytest.mark.slow
def test_a_run_on_robertas_recipe_trains_and_records_its_optimiser(shared_data, tmp_path):
  """TINY_RUN's schedule and batch; the recipe's Adam (bias-corrected, β2 0.98, no clipping), weight decay and
  rate go into the run's config.json, which eval, predict and a resume read."""
  root = glue_data(shared_data, "rte", tmp_path / "glue")
  config = f"experiments/glue.py:task=rte,size=tiny,data={root},spm={spm(shared_data)},recipe=roberta"
  result = finetune_cli(config, tmp_path / "run", *TINY_RUN, fast_compile=True)
  assert result.returncode == 0, result.stdout + result.stderr
  train = json.load(open(tmp_path / "run" / "config.json"))["train"]
  assert (train["b2"], train["weight_decay"], train["adam_bias_correction"], train["clip_grad_norm"],
          train["learning_rate"], train["num_train_steps"]) == (0.98, 0.1, True, 0.0, 2e-5, 4)
