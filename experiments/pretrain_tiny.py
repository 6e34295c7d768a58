"""The CPU default: a tiny ALBERT pretrained on the small public-domain corpus shipped with the package.

`python -m albert_jax.main --config experiments/pretrain_tiny.py --workdir=/tmp/albert_tiny` trains a
SentencePiece model and prepares shards on first use (seconds), then runs a few hundred steps on 2 CPU cores:
the MLM loss falls visibly and SOP accuracy rises above chance. `:synthetic` uses random batches instead.
"""
from experiments import common


def get_config(arg=None):
  args = common.parse_arg(arg, synthetic=False)
  c = common.pretraining_config("tiny")
  c.model.vocab_size = 4000           # the tiny corpus's SentencePiece model (data_pipeline.tiny)
  c.model.hidden_size = 128
  c.model.intermediate_size = 512
  c.model.dtype = "float32"           # CPU: float32 is the fast path, and the model is small enough to keep
  c.model.remat_policy = "none"       # every activation
  c.model.scan_unroll = c.model.num_hidden_layers  # straight-line layers: faster CPU steps, compiles in seconds
  c.data.kind = "synthetic" if args.synthetic else "tiny"
  c.data.tiny_tokenizer = "unigram"   # the bundled corpus's: "unigram" (SentencePiece) | "bpe" | "wordpiece"
  c.data.max_seq_length = 64
  c.data.max_predictions_per_seq = 10
  c.train.global_batch_size = 64
  c.train.num_train_steps = 500
  c.train.warmup_steps = 50
  c.train.learning_rate = 1e-2        # LAMB; the small model tolerates a large rate
  c.train.eval_every = 250
  c.train.eval_batches = 8
  c.checkpoint.every = 250
  c.checkpoint.keep = 2
  c.log.every = 50
  return c
