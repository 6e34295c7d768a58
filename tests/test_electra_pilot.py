"""bench/electra_pilot.py: its runs are the study's ELECTRA pair with only the optimizer, the generator's rate and
the checkpoint and evaluation cadence changed (parsed as albert_jax.main parses them), and its ROC-AUC against hand
computations."""
import json

import numpy as np
import pytest

from albert_jax import cli
from bench import electra_pilot as pilot
from bench import paper_small as ps
from bench import paper_small_recipes as recipes

CPU = ps.SCALES["cpu"]


def flat(tree, prefix=""):
  out = {}
  for key, value in tree.items():
    out.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
  return out


def test_the_pilot_runs_change_only_the_optimizer_the_generator_rate_and_the_cadence(tmp_path):
  study = pilot.PilotStudy(CPU, str(tmp_path), "", "shared")
  parse = lambda run: flat(json.loads(cli.experiment_config(["albert_jax.main", *study.argv(run)]).to_json()))
  electra, _, _ = recipes.pretraining_runs("cpu")
  reference = flat(json.loads(cli.experiment_config(["albert_jax.main", *ps.Study(
      CPU, str(tmp_path), "", "shared").argv(electra)]).to_json()))
  assert (reference["train.optimizer"], reference["train.learning_rate"]) == ("lamb", 0.01)
  for run, multiplier in zip(pilot.VARIANTS.values(), (1.0, 0.25)):
    config = parse(run)
    changed = {k: v for k, v in config.items() if reference.get(k) != v}
    assert changed == {
        "train.optimizer": "adamw", "train.adam_bias_correction": True, "train.learning_rate": 5e-4,
        "checkpoint.every": 100, "checkpoint.keep": 25, "train.eval_every": 2400,
        **({} if multiplier == 1.0 else {"electra.generator_lr_multiplier": multiplier})}, run.name
    assert config["electra.generator_lr_multiplier"] == multiplier
  assert len({run.name for run in pilot.VARIANTS.values()}) == 2


def test_roc_auc_counts_the_pairs_a_positive_wins_and_ties_as_half():
  scores = np.array([0.1, 0.4, 0.4, 0.8, 0.2], np.float32)
  labels = np.array([0, 1, 0, 1, 1])
  # Positives 0.4, 0.8, 0.2 against negatives 0.1, 0.4: (1 + 0.5) + (1 + 1) + (1 + 0) of 6 pairs.
  assert pilot.roc_auc(scores, labels) == pytest.approx(4.5 / 6)
  assert pilot.roc_auc(scores, 1 - labels) == pytest.approx(1.5 / 6)
  assert pilot.roc_auc(np.array([0.0, 1.0, 2.0, 3.0]), np.array([0, 0, 1, 1])) == 1.0
  assert pilot.roc_auc(np.zeros(4), np.array([0, 1, 0, 1])) == 0.5
