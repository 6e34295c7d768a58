"""The paper's ALBERT-base ablations (Tables 3-5): embedding size, cross-layer sharing, sentence-pair task.

`experiments/ablation.py:embedding_size=768,sharing=none,sentence_task=nsp` — embedding_size in {64, 128, 256,
768}; sharing in {all, attention, ffn, none}; sentence_task in {sop, nsp, none}. Everything else is the paper's
ALBERT-base recipe (`pretrain_base.py`).
"""
from experiments import common


def get_config(arg=None):
  args = common.parse_arg(arg, embedding_size=128, sharing="all", sentence_task="sop", size="base")
  c = common.pretraining_config(args.size)
  c.model.embedding_size = args.embedding_size
  c.model.sharing = args.sharing
  c.data.sentence_task = args.sentence_task
  return c
