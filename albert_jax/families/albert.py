"""ALBERT (and BERT-shaped models without layer sharing, which leave as ALBERT classes with one group per layer)."""
from albert_jax.families import Family, register

ALBERT = register(Family(name="albert", hf_model_type="albert", hf_prefix="Albert", classifier_head="albert",
                         tokenizer="sentencepiece"))
