"""ALBERT-large pretraining with the paper's recipe. Variants: `experiments/pretrain_large.py:version=v1`."""
from experiments import common


def get_config(arg=None):
  args = common.parse_arg(arg, version="v2")
  return common.pretraining_config("large" if args.version == "v2" else "large_v1")
