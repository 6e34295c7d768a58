"""A run refused while it is set up leaves no workdir behind: the folder it would have created holds only what
set-up writes (the head's record, the compilation cache, the lock, the checkpoint folder opened empty), which a
rerun writes again."""
from __future__ import annotations

import contextlib
import os
import shutil
from typing import Iterator

from albert_jax import storage
from albert_jax.errors import is_user_error
from albert_jax.run.layout import CHECKPOINTS_DIR, COMPILATION_CACHE_DIR, HEAD_FILE, LOCK_FILE, Run

SET_UP_NAMES = frozenset({HEAD_FILE, COMPILATION_CACHE_DIR, LOCK_FILE})


@contextlib.contextmanager
def leaves_no_new_workdir(workdir: str | None) -> Iterator[None]:
  """Inside, a user error (a refusal) removes `workdir` if it did not exist on entry and holds nothing but
  SET_UP_NAMES and an empty checkpoint folder: nothing trained, nothing to keep. A local workdir only (a bucket is
  left as it is)."""
  new = bool(workdir) and not storage.is_remote(workdir) and not os.path.exists(workdir)
  try:
    yield
  except Exception as e:
    if new and is_user_error(e) and os.path.isdir(workdir) and _set_up_only(workdir):
      shutil.rmtree(workdir, ignore_errors=True)
    raise


def _set_up_only(workdir: str) -> bool:
  return all(name in SET_UP_NAMES or (name == CHECKPOINTS_DIR and not os.listdir(Run(workdir).checkpoints))
             for name in os.listdir(workdir))
