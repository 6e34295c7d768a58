"""SQuAD v1.1 fine-tuning with the original README recipe: `experiments/squad_v1.py:size=base,data=DIR,spm=PATH`.

DIR holds train-v1.1.json and dev-v1.1.json (the official files). `recipe=electra_base` (or electra_small,
electra_large), `recipe=roberta` or `recipe=bert` takes that paper's recipe instead of ALBERT's
(experiments/common.py FINETUNING_RECIPES).
"""
from experiments import common


def get_config(arg=None):
  args = common.parse_arg(arg, size="base", data="", spm="", recipe="albert")
  return common.squad_config(args.size, 1, args.data, args.spm, common.check_recipe(args.recipe))
