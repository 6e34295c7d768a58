"""ALBERT-base pretraining with the paper's recipe. Variants: `experiments/pretrain_base.py:version=v1`."""
from experiments import common


def get_config(arg=None):
  args = common.parse_arg(arg, version="v2")
  return common.pretraining_config("base" if args.version == "v2" else "base_v1")
