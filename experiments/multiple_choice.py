"""Your own multiple-choice data: `experiments/multiple_choice.py:data=DIR,choices=4`.

Args: data (a folder with train.jsonl, dev.jsonl[, test.jsonl]: {"context", "question", "options", "answer"}),
choices (the most options a question has; fewer are masked), size, spm.
"""
from experiments import common


def get_config(arg=None):
  args = common.parse_arg(arg, size="base", data="", spm="", choices=4)
  c = common.own_data_config(args.size, "multiple_choice", args.data, args.spm, max_seq_length=256,
                             learning_rate=2e-5, batch=16, num_choices=args.choices)
  c.data.max_qa_length = 64       # question+option tokens kept (the LAST ones); the context is cut to fit
  return c
