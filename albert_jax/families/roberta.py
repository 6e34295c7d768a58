"""RoBERTa (Liu et al., 2019): BERT's layers, positions counted past the padding index (`model.position_offset`),
LayerNorm eps 1e-5, no sentence task; its classification head reads the first token through dense, tanh and a
projection (ELECTRA's head with tanh for GELU), no pooler; byte-level BPE. Its weights in transformers' classes:
`formats.hf_bert`; transformers has no RobertaForPreTraining."""
import functools

from albert_jax.families.family import PRETRAINING, ROLES, Family


def _classifier():
  from albert_jax.families.electra_model import ElectraClassifier
  return functools.partial(ElectraClassifier, activation="tanh")


ROBERTA = Family(
    name="roberta", title="RoBERTa", hf_model_type="roberta", hf_prefix="Roberta", classifier_head="roberta",
    classifier=_classifier, classifier_note="dense, tanh, projection, on the first token; no pooler",
    tokenizer="bpe", pretraining_task="pretrain", roles=tuple(role for role in ROLES if role != PRETRAINING))
