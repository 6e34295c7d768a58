"""BERT (Devlin et al., 2019): one weight set per layer, E = H, a pooler feeding NSP (our sentence task's head) and
sequence classification; its released checkpoints ship a WordPiece vocab.txt. Its model is our encoder with
sharing "none"; its weights in transformers' classes: `formats.hf_bert`."""
from albert_jax.families.family import Family


def _classifier() -> type:
  from albert_jax.tasks.heads import PooledClassifier
  return PooledClassifier


BERT = Family(
    name="bert", title="BERT", hf_model_type="bert", hf_prefix="Bert", classifier_head="bert",
    classifier=_classifier, classifier_note="dropout and dense on the pooler's tanh(dense) of [CLS]",
    tokenizer="wordpiece", pretraining_task="pretrain")
