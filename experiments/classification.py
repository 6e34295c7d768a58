"""Your own classification data: `experiments/classification.py:data=DIR,text=sentence,label=label`.

Args: data (a folder with train/dev[/test] as .tsv, .csv or .jsonl), text / text_pair (column names; text_pair
empty for single texts), label (column), labels ("neg|pos": class names in output order; empty = the sorted
labels of the train file), regression (a numeric label, MSE), multi_label (any number of classes per row, the
label cell "a|b", empty for none: one sigmoid per class, binary cross-entropy, thresholds tuned on dev), id (a
column kept in predictions), size, spm.
"""
from experiments import common


def get_config(arg=None):
  args = common.parse_arg(arg, size="base", data="", spm="", text="text", text_pair="", label="label", labels="",
                          regression=False, multi_label=False, id="")
  task = "multi_label_classification" if args.multi_label else "classification"
  return common.own_data_config(args.size, task, args.data, args.spm, max_seq_length=128,
                                learning_rate=2e-5, batch=32, labels=args.labels, text_column=args.text,
                                text_pair_column=args.text_pair, label_column=args.label, id_column=args.id,
                                regression=args.regression)
