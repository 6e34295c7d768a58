"""SQuAD v1.1 fine-tuning with the original README recipe: `experiments/squad_v1.py:size=base,data=DIR,spm=PATH`.

DIR holds train-v1.1.json and dev-v1.1.json (the official files).
"""
from experiments import common


def get_config(arg=None):
  args = common.parse_arg(arg, size="base", data="", spm="")
  return common.squad_config(args.size, 1, args.data, args.spm)
