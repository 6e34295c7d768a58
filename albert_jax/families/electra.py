"""ELECTRA: one weight set per layer, a discriminator (and its generator) over shared embeddings, no pooler; its
classification head and multiple-choice scorer read the first token (`classifier_head` "electra"); its released
checkpoints ship a WordPiece vocab.txt. Its model pair and heads: `electra_model`; its pretraining objective:
`electra_pretraining` (config.task "electra")."""
from albert_jax.families.family import SEQUENCE_CLASSIFICATION, Family

GENERATOR = "generator"  # the top-level names of its generator's parameters start with it


def _classifier() -> type:
  from albert_jax.families.electra_model import ElectraClassifier
  return ElectraClassifier


def _multiple_choice() -> type:
  from albert_jax.families.electra_model import ElectraMultipleChoice
  return ElectraMultipleChoice


ELECTRA = Family(
    name="electra", title="ELECTRA", hf_model_type="electra", hf_prefix="Electra", classifier_head="electra",
    classifier=_classifier, classifier_note="dense, GELU, projection, on the first token; no pooler",
    tokenizer="wordpiece", pretraining_task="electra", run_marker=GENERATOR, multiple_choice=_multiple_choice,
    run_backbone_note="its discriminator (with the shared embeddings) is the backbone; the generator and the "
                      "replaced-token head are dropped")
HF_SEQUENCE_CLASSIFICATION = ELECTRA.hf_class(SEQUENCE_CLASSIFICATION)  # its head's transformers class
