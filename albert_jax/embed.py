"""`--mode=embed --input=TEXTS --output=OUT.npy [--pooling=mean|pooled]`: one vector per line of a text file.

The backbone of the workdir's weights (fine-tuning: best, else latest; pretraining: latest), or of
`config.init_checkpoint` when the workdir has none (a converted or pretraining checkpoint used as it is). Each
line is one text, `[CLS] text [SEP]` cut to `data.max_seq_length`; row i of the float32 array [lines, hidden]
is line i (blank lines included, so rows and line numbers agree). `pooled`: the [CLS] pooler output (tanh dense,
what the sentence heads see); `mean`: the mean of the last layer's vectors over the attention mask, special
tokens included (sentence-transformers' mean pooling).
"""
from __future__ import annotations

import io

import jax
import jax.numpy as jnp
import numpy as np

from albert_jax import engine, feature_batches, prediction, storage
from albert_jax.errors import EnvironmentUserError, InputError
from albert_jax.model import AlbertModel
from albert_jax.run import Run, provenance
from albert_jax.tasks import make_tokenizer
from albert_jax.tasks.base import model_inputs, stack_packed
from albert_jax.tasks.records import text_lines
from albert_jax.tasks.sequence import pack_text
from albert_jax.weights.resolve import resolve

POOLINGS = ("mean", "pooled")


def embed_fn(model: AlbertModel, pooling: str):
  def embed(params, batch):
    sequence, pooled = model.apply({"params": params}, **model_inputs(batch), deterministic=True)
    if pooling == "pooled":
      return {"embedding": pooled.astype(jnp.float32)}
    mask = batch["attention_mask"][..., None].astype(jnp.float32)
    return {"embedding": (sequence.astype(jnp.float32) * mask).sum(1) / jnp.maximum(mask.sum(1), 1.0)}
  return embed


def _write_npy(output: str, array: np.ndarray) -> None:
  """`array` as a .npy file at the very name given (np.save adds .npy), folders made, or nothing there. Saved to
  memory first: numpy's own write to a file reports a full disk as a bare "N requested and M written"."""
  buffer = io.BytesIO()
  np.save(buffer, array)
  try:
    with storage.open_atomic(output, "wb") as f:
      f.write(buffer.getbuffer())
  except OSError as e:
    raise EnvironmentUserError(f"Writing --output={output} failed ({e.strerror or e}); free space, or pass an "
                               "--output elsewhere, and rerun.") from None


def embed(config, run: Run, args, kind) -> None:
  """`kind`: the config's `job_kinds.JobKind`, which builds the job and finds the encoder in the weights."""
  if not args.input or not args.output:
    raise InputError("--mode=embed needs --input=FILE (one text per line) and --output=PATH.npy.")
  if args.pooling not in POOLINGS:
    raise InputError(f"--pooling={args.pooling!r}; choose one of {POOLINGS}.")
  path, name = run.weights(config.init_checkpoint)
  weights = resolve(path, config, args.overrides, flag=name)
  config = weights.config
  tokenizer = make_tokenizer(config)
  model_config = kind.model_config(config)
  tokenizer.check_vocab(model_config.vocab_size)
  max_len = config.data.max_seq_length
  model_config.check_seq_length(max_len)
  # Only the backbone is used, so a fine-tuning run's head (its task, its classes) does not matter here.
  provenance.check_reader(weights.run, weights.named, config)
  which = weights.named
  encoder = kind.backbone_params(weights.params, which)
  texts = [line for _, line in text_lines(args.input)]  # a CR-only file is refused, not embedded as one text
  if texts[-1] == "":  # the newline that ends the last line starts no text
    texts.pop()
  if not texts:
    raise InputError(f"{args.input} has no lines to embed.")
  features = stack_packed([pack_text(tokenizer, text, None, max_len) for text in texts], (len(texts),))
  backbone = AlbertModel(model_config)
  s = engine.setup(config, kind.embedding_job(config, backbone))
  with s.context():
    outputs = prediction.predict_features(embed_fn(backbone, args.pooling), s.replicate(encoder), features, s,
                                          f"embedding {args.input}", feature_batches.length_buckets(config))
  if jax.process_index() == 0:
    _write_npy(args.output, outputs["embedding"].astype(np.float32))
    print(f"Wrote {args.pooling} embeddings {outputs['embedding'].shape} of {args.input} ({which}) to {args.output}",
          flush=True)
