"""ALBERT-xlarge pretraining with the paper's recipe. Variants: `experiments/pretrain_xlarge.py:version=v1`."""
from experiments import common


def get_config(arg=None):
  args = common.parse_arg(arg, version="v2")
  return common.pretraining_config("xlarge" if args.version == "v2" else "xlarge_v1")
