"""BERT-large baseline: `bert_base.py`'s setup (ALBERT's pretraining recipe, as the paper's comparison) at
BERT-large's size, so only the model section differs from `pretrain_large.py`.
"""
from experiments import bert_base


def get_config(arg=None):
  del arg
  return bert_base.bert_config("bert_large")
