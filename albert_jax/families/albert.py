"""ALBERT (and BERT-shaped models without layer sharing, which leave as ALBERT classes with one group per layer)."""
from albert_jax.families.family import Family, pooled_classifier

ALBERT = Family(
    name="albert", title="ALBERT", hf_model_type="albert", hf_prefix="Albert", classifier_head="albert",
    classifier=pooled_classifier, classifier_note="dropout and dense on the pooler's tanh(dense) of [CLS]",
    tokenizer="sentencepiece", pretraining_task="pretrain")
