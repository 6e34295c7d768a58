"""SQuAD v2.0 fine-tuning with the original README recipe: `experiments/squad_v2.py:size=base,data=DIR,spm=PATH`.

DIR holds train-v2.0.json and dev-v2.0.json (the official files).
"""
from experiments import common


def get_config(arg=None):
  args = common.parse_arg(arg, size="base", data="", spm="")
  return common.squad_config(args.size, 2, args.data, args.spm)
