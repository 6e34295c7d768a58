"""SQuAD v2.0 fine-tuning with the original README recipe: `experiments/squad_v2.py:size=base,data=DIR,spm=PATH`.

DIR holds train-v2.0.json and dev-v2.0.json (the official files). `head=answer_class` trains the original's
answer-class head with start/end beam search (run_squad_v2.py) instead of the default null-score span head
(`head=null_score`); the same switch is `--config.data.v2_head`, with `data.start_n_top`/`data.end_n_top` the beam.
`recipe=electra_base` (or electra_small, electra_large), `recipe=roberta` or `recipe=bert` takes that paper's recipe
instead of ALBERT's; each keeps the null-score threshold 0 (`data.null_score_diff_threshold`; dev's best_f1_thresh
is the one to set, as BERT's README says).
"""
from experiments import common


def get_config(arg=None):
  args = common.parse_arg(arg, size="base", data="", spm="", head="null_score", recipe="albert")
  c = common.squad_config(args.size, 2, args.data, args.spm, common.check_recipe(args.recipe))
  c.data.v2_head = args.head  # checked with the other task settings when the task is built (tasks/squad.py)
  return c
