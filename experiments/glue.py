"""GLUE fine-tuning with the original `run_glue.sh` recipes: `experiments/glue.py:task=sst-2,size=base`.

Args: task (cola, sst-2, mrpc, sts-b, qqp, mnli, qnli, rte, wnli, ax), size (a model size name, e.g. base,
large_v1), data (the GLUE root holding CoLA/, SST-2/, ..., diagnostic/), spm (the SentencePiece model), recipe
(albert: run_glue.sh's; electra_small, electra_base or electra_large: ELECTRA's, with layer-wise learning-rate
decay, for an ELECTRA or BERT backbone: `experiments/glue.py:task=rte,recipe=electra_base`; roberta: RoBERTa's
Table 10 with fairseq's per-task rates; bert: BERT's paper, lr 2e-5, whose grid {5e-5, 4e-5, 3e-5, 2e-5}
`python -m albert_jax.seeds --learning_rates=5e-5,4e-5,3e-5,2e-5` sweeps). The roberta and bert recipes have no
WNLI. `ax` (the diagnostic set) only predicts, with the MNLI model: set init_checkpoint to the MNLI run.
"""
import os

from albert_jax.tasks.glue import spec_for
from experiments import common


def get_config(arg=None):
  args = common.parse_arg(arg, task="sst-2", size="base", data="", spm="", recipe="albert")
  recipe = common.check_recipe(args.recipe)
  task = args.task.lower()
  spec = spec_for(task)
  c = common.finetuning_config(args.size, "glue", task_name=task, spm_model=args.spm,
                               data=os.path.join(args.data, spec.directory) if args.data else "")
  if task == "ax":  # predictions only: no training steps
    learning_rate, warmup, _, batch, every = common.GLUE_RECIPES["mnli"]
    return common.set_recipe(c, learning_rate, warmup, 0, batch, every)
  if recipe in common.FINETUNING_RECIPES:
    return common.published_recipe(c, recipe, task)
  return common.set_recipe(c, *common.GLUE_RECIPES[task])
