"""ALBERT (and BERT-shaped models without layer sharing, which leave as ALBERT classes with one group per layer)."""
from albert_jax.families.family import Family


def _classifier() -> type:
  from albert_jax.tasks.heads import PooledClassifier
  return PooledClassifier


ALBERT = Family(
    name="albert", title="ALBERT", hf_model_type="albert", hf_prefix="Albert", classifier_head="albert",
    classifier=_classifier, classifier_note="dropout and dense on the pooler's tanh(dense) of [CLS]",
    tokenizer="sentencepiece", pretraining_task="pretrain")
