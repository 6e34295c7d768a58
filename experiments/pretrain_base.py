"""ALBERT-base pretraining with the paper's recipe. Variants: `experiments/pretrain_base.py:version=v1`."""
from experiments import common


def get_config(arg=None):
  return common.released_pretraining_config("base", arg)
