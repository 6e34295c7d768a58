"""A training run, passed as one `Run` value: its folder's layout (`layout`), and the records it keeps there, one
module each: its config across resumes (`config`), what it is made from (`provenance`), its best dev checkpoint
(`best`, kept by `best_keeper`), the W&B id its trackers resume (`tracker_ids`), and the lock of the process that
trains it (`lock`)."""
from albert_jax.run.layout import Run, as_run, check_output, is_run, run_of_best, run_of_weights

__all__ = ["Run", "as_run", "check_output", "is_run", "run_of_best", "run_of_weights"]
