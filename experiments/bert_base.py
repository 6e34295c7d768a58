"""BERT-base baseline (no factorisation, no sharing) with ALBERT's pretraining recipe, as the paper's comparison.

The paper trains every model with the same setup (batch 4096, LAMB 0.00176, 125k steps, seq 512, SOP + n-gram
MLM), so only the model section differs from `pretrain_base.py` (and `bert_large.py`'s from `pretrain_large.py`).
"""
from experiments import common


def bert_config(size: str):
  """ALBERT's pretraining recipe for the BERT-shaped model `size`, whose runs export as BertForPreTraining."""
  c = common.pretraining_config(size)
  c.model_family = "bert"  # (`families.of_run`)
  return c


def get_config(arg=None):
  del arg
  return bert_config("bert_base")
