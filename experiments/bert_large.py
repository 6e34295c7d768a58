"""BERT-large baseline (no factorisation, no sharing) with ALBERT's pretraining recipe, as the paper's comparison.

The paper trains every model with the same setup (batch 4096, LAMB 0.00176, 125k steps, seq 512, SOP + n-gram
MLM), so only the model section differs from `pretrain_large.py`.
"""
from experiments import common


def get_config(arg=None):
  del arg
  c = common.pretraining_config("bert_large")
  c.model_family = "bert"  # exports as BertForPreTraining (`families.of_run`)
  return c
