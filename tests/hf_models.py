"""Random transformers (PyTorch) ALBERT models, their forward pass and safetensors files: what the Hugging Face
interop tests compare ours against. Importing this module requires the `hf` extra (torch and transformers): it is
a failure in CI (CI set) and a skip elsewhere without it."""
import os

import numpy as np
import safetensors.numpy

from albert_jax.formats import hf_files
from tests.helpers import require_module

torch = require_module("torch", extra="hf")
transformers = require_module("transformers", extra="hf")

SMALL = dict(vocab_size=97, embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=64, max_position_embeddings=24)


def hf_model(cls=transformers.AlbertForPreTraining, seed=0, sizes=SMALL, **overrides):
  """A random-init HF model of `sizes` in eval mode whose every parameter is random (so a swapped bias or LN
  shows)."""
  torch.manual_seed(seed)
  model = cls(cls.config_class(**{**sizes, **overrides})).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      is_scale = name.endswith(("LayerNorm.weight", "layer_norm.weight"))
      p.copy_(torch.randn_like(p) * (0.1 if is_scale else 0.05) + (1.0 if is_scale else 0.0))
  return model


def saved(model, directory) -> str:
  model.save_pretrained(directory)
  return str(directory)


def batch():
  """Right-padded batch of lengths 12, 7 and 3, with two segments."""
  ids = np.random.RandomState(0).randint(0, SMALL["vocab_size"], (3, 12))
  mask = (np.arange(12)[None] < np.array([[12], [7], [3]])).astype(np.int64)
  token_types = (np.arange(12)[None] >= np.array([[6], [4], [2]])).astype(np.int64) * mask
  return ids * mask, mask, token_types


def hf_forward(model, ids, mask, token_types):
  with torch.no_grad():
    return model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                 token_type_ids=torch.tensor(token_types))


def read(directory) -> dict[str, np.ndarray]:
  return safetensors.numpy.load_file(os.path.join(directory, hf_files.SAFETENSORS_FILE))


def assert_same_tensors(a: dict, b: dict):
  assert sorted(a) == sorted(b)
  for key in a:
    assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), key
