"""RACE fine-tuning: `experiments/race.py:size=base,data=DIR,spm=PATH`, DIR = the RACE folder (train/ dev/ test/,
each with middle/ and high/).

Recipe of the original README: msl 512, max_qa_length 128, batch 32, 12000 steps, warmup 1000, lr 1e-5 for
the v2 models (its note: v1's settings diverge on v2). v1 sizes use the paper's appendix lr 2e-5.
Dev is scored every 1000 steps (our choice; the README does not fix it). `recipe=roberta` takes RoBERTa's (its
Table 10: lr 1e-5, batch 16, 4 epochs, 6% warmup, weight decay 0.1; experiments/common.py FINETUNING_RECIPES).
"""
from experiments import common


def get_config(arg=None):
  args = common.parse_arg(arg, size="base", data="", spm="", recipe="albert")
  recipe = common.check_recipe(args.recipe)
  c = common.finetuning_config(args.size, "race", data=args.data, spm_model=args.spm)
  c.data.max_qa_length = 128      # question+option tokens kept (the LAST ones)
  if recipe in common.FINETUNING_RECIPES:
    return common.published_recipe(c, recipe, "race", sequences_per_example=4)
  learning_rate = 2e-5 if args.size.endswith("_v1") else 1e-5
  return common.set_recipe(c, learning_rate, 1000, 12000, 32, eval_every=1000, sequences_per_example=4)
