"""ELECTRA: one weight set per layer, a discriminator (and its generator) over shared embeddings, no pooler; its
classification head reads the first token (`classifier_head` "electra"); its released checkpoints ship a WordPiece
vocab.txt."""
from albert_jax.families import Family, register

ELECTRA = register(Family(name="electra", hf_model_type="electra", hf_prefix="Electra", classifier_head="electra",
                          tokenizer="wordpiece"))
