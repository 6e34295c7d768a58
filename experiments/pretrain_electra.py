"""ELECTRA's replaced-token detection (Clark et al., ICLR 2020): a generator does MLM, a discriminator learns on every
position which tokens its samples replaced; the discriminator is what fine-tuning takes
(`albert_jax/families/electra_pretraining.py`).

`:size=tiny` is pretrain_tiny.py's CPU setting (the bundled corpus and its 4,000-piece tokenizer, built on first
use); `small`, `base` and `large` are the paper's shapes and recipes on prepared data (`--config.data.path`):
AdamW (β2 0.999, ε 1e-6, weight decay 0.01), linear warmup over 10k steps then linear decay, no layer sharing,
exact GELU, dropout 0.1, single-token masking, masked positions int((p + 0.005) · seq). `sharing=` and
`embedding_size=` give the ALBERT-style pair (cross-layer sharing in both towers, a factorised embedding):
`:size=base,sharing=all,embedding_size=128`.
"""
import ml_collections

from albert_jax.errors import InputError
from experiments import common

# size: (layers, hidden, embedding, heads, seq, batch, learning rate, generator fraction, mask share, steps)
ELECTRA_SIZES = {
    "small": (12, 256, 128, 4, 128, 128, 5e-4, 1 / 4, 0.15, 1_000_000),
    "base": (12, 768, 768, 12, 512, 256, 2e-4, 1 / 3, 0.15, 766_000),
    "large": (24, 1024, 1024, 16, 512, 2048, 2e-4, 1 / 4, 0.25, 400_000),
}


def masked_positions(mask_share: float, seq_len: int) -> int:
  """The released code's count of masked positions per sequence."""
  return int((mask_share + 0.005) * seq_len)


def get_config(arg=None):
  args = common.parse_arg(arg, size="tiny", sharing="none", embedding_size=0)
  if args.size != "tiny" and args.size not in ELECTRA_SIZES:
    raise InputError(f"Config argument size={args.size!r}; choose one of {['tiny', *ELECTRA_SIZES]}.")
  c = common.pretraining_config("tiny" if args.size == "tiny" else "bert_base")
  c.task = "electra"
  c.electra = ml_collections.ConfigDict()
  c.electra.generator_fraction = 1 / 4    # the generator's hidden size, FFN size and heads, of the discriminator's
  c.electra.discriminator_weight = 50.0   # λ of L_MLM + λ · L_disc
  c.electra.init_generator = ""          # with init_checkpoint: its generator's folder ("": its generator/ if any)
  c.electra.generator_lr_multiplier = 1.0  # the generator's updates times this (1: the discriminator's rate)
  c.data.sentence_task = "none"
  c.data.ngram = 1                        # single tokens, as ELECTRA masks
  c.train.optimizer = "adamw"
  c.train.b2, c.train.eps, c.train.weight_decay = 0.999, 1e-6, 0.01
  if args.size == "tiny":
    _tiny(c)
  else:
    _paper(c, *ELECTRA_SIZES[args.size])
  c.model.sharing = args.sharing
  if args.embedding_size:
    c.model.embedding_size = args.embedding_size
  return c


def _tiny(c):
  """pretrain_tiny.py's model, data and optimizer (LAMB at 1e-2: on this corpus its discriminator leaves chance
  sooner than AdamW's at 2e-3 or 5e-3), without layer sharing, with ELECTRA's exact GELU (what transformers'
  ELECTRA classes compute, so the run exports), for 300 steps."""
  c.model.vocab_size = 4000               # the tiny corpus's SentencePiece model (data_pipeline.tiny)
  c.model.hidden_act = "gelu"
  c.model.hidden_size = 128
  c.model.intermediate_size = 512
  c.model.dtype = "float32"
  c.model.remat_policy = "none"
  c.model.scan_unroll = c.model.num_hidden_layers
  c.data.kind = "tiny"
  c.data.max_seq_length = 64
  c.data.max_predictions_per_seq = masked_positions(0.15, 64)
  c.train.global_batch_size = 64
  c.train.num_train_steps = 300
  c.train.warmup_steps = 30
  c.train.optimizer = "lamb"
  c.train.learning_rate = 1e-2
  c.train.eval_every = 150
  c.train.eval_batches = 8
  c.checkpoint.every = 150
  c.checkpoint.keep = 2
  c.log.every = 25


def _paper(c, layers, hidden, embedding, heads, seq, batch, lr, fraction, mask_share, steps):
  c.model.update(num_hidden_layers=layers, hidden_size=hidden, embedding_size=embedding, num_attention_heads=heads,
                 intermediate_size=4 * hidden, hidden_act="gelu", hidden_dropout_prob=0.1,
                 attention_probs_dropout_prob=0.1)
  c.electra.generator_fraction = fraction
  c.data.max_seq_length = seq
  c.data.masked_lm_prob = mask_share
  c.data.max_predictions_per_seq = masked_positions(mask_share, seq)
  c.train.global_batch_size = batch
  c.train.learning_rate = lr
  c.train.warmup_steps = 10_000
  c.train.num_train_steps = steps
