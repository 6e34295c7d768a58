"""Fault injection: one training run killed with SIGKILL at 12 random moments (start-up, restores, compilation,
compilation-cache writes, steps, checkpoint saves) and relaunched after each until it completes ends exactly like
the same run left alone: the same final parameters, the same values for every logged step, and a workdir with
nothing left over that could confuse a later run.

The moments come from a seeded RNG. The seed is printed and named in every failure; ALBERT_JAX_KILL_SEED=N
replays its schedule (where in the run each moment falls still depends on the machine's timing)."""
import os
import time

import numpy as np
import pytest
from jax._src import compilation_cache

from albert_jax import checkpointing
from albert_jax.run import Run
from tests.helpers import SMALL_RUN, assert_trees_equal, final_params, pretrain_cli
from tests.processes import TMP_MARK, Launch, records, without_timing

STEPS = 40
KILL_RUN = [*SMALL_RUN, "--config.checkpoint.async_save=true", f"--config.train.num_train_steps={STEPS}",
            "--config.checkpoint.every=2", "--config.checkpoint.keep=2"]
# How many kills of each kind:
#   time     a random time after launch: imports, the lock, config, restore, compilation or the first steps;
#   step     a little after a random step's progress line: the next step, its metrics, a save starting;
#   save     inside an asynchronous checkpoint save: orbax's temporary directory has appeared;
#   restore  inside a restore: the "Restoring" line was printed;
#   cache    at the compilation-cache write of the train step (its entry is removed before the launch), the entry
#            then often cut short as a kill inside jax's in-place write would leave it.
# Every kind at least twice; every run draws new moments (a new seed).
KILLS = {"time": 3, "step": 2, "save": 3, "restore": 2, "cache": 2}
REMOVED_ENTRY = "Removed the compilation cache entry"


def cli(*args, **kwargs):
  """`pretrain_cli`, compiling fast: the victim is compared only with the reference run."""
  return pretrain_cli(*args, fast_compile=True, **kwargs)


def temporary_dirs(ckpt_dir, since_ns: int) -> set[tuple[str, int]]:
  """(name, inode) of orbax's temporary step directories created since `since_ns`."""
  found = set()
  try:
    entries = list(os.scandir(ckpt_dir))
  except FileNotFoundError:
    return found
  for entry in entries:
    try:
      if TMP_MARK in entry.name and entry.stat().st_ctime_ns >= since_ns:
        found.add((entry.name, entry.inode()))
    except FileNotFoundError:  # renamed into place meanwhile
      pass
  return found


def kill_at_a_moment(launch: Launch, kind: str, rng, ckpt_dir, step_entry, context: str) -> str:
  """Waits for the moment of `kind` the RNG draws, kills the launch there and says where that was."""
  delay = {"time": rng.uniform(0, 10.0), "step": rng.uniform(0, 0.15), "save": rng.uniform(0, 0.05),
           "restore": rng.uniform(0, 0.5), "cache": 0.0}[kind]
  at_step, saves_to_see, saves = int(rng.integers(1, 7)), int(rng.integers(1, 3)), set()
  triggered = 0.0 if kind == "time" else None
  while triggered is None or launch.elapsed() < triggered + delay:
    if launch.proc.poll() is not None:
      launch.finish()
      raise AssertionError(f"{context}: the launch ended by itself (exit {launch.proc.returncode}):\n"
                           f"{launch.output()}")
    assert launch.elapsed() < 300, f"{context}: the moment did not come in 300 s:\n{launch.output()}"
    if launch.last_step() >= STEPS - 4:  # a launch must not finish the run before the last kill
      kind, triggered, delay = "late", launch.elapsed(), 0.0
    elif triggered is None:
      if kind == "step" and launch.steps >= at_step:
        triggered = launch.elapsed()
      elif kind == "save":
        saves |= temporary_dirs(ckpt_dir, launch.start_ns)
        if len(saves) >= saves_to_see:
          triggered = launch.elapsed()
      elif kind == "restore" and launch.saw("Restoring the newest checkpoint"):
        triggered = launch.elapsed()
      elif kind == "cache" and step_entry.exists():
        triggered = launch.elapsed()
    time.sleep(0.003)
  at = launch.elapsed()
  launch.kill()
  where = [f"{kind:7s} at {at:5.2f} s"]
  if temporary_dirs(ckpt_dir, launch.start_ns):
    where.append("inside a save")
  if launch.saw("Restoring the newest") and not launch.saw("Resumed from"):
    where.append("inside the restore")
  last = [line for _, line in launch.lines if line.strip()]
  return ", ".join(where) + f" | last line: {last[-1][:70] if last else '-'}"


def check_cut_entry_removed(launch: Launch, was_cut: bool, context: str) -> None:
  """A launch that found the step's cache entry cut short and got as far as compiling removed it first."""
  if was_cut and launch.saw("Compiling the train step"):
    assert launch.saw(REMOVED_ENTRY), f"{context}\n{launch.output()}"


def stamp(path) -> tuple[int, int] | None:
  try:
    return path.stat().st_size, path.stat().st_mtime_ns
  except FileNotFoundError:
    return None


def latest_step(workdir):
  return checkpointing.Checkpointer(Run(str(workdir)).checkpoints, 1, 1).latest_step()


@pytest.mark.slow
def test_a_run_killed_at_random_moments_ends_like_an_uninterrupted_one(tmp_path, launches):
  seed = int(os.environ.get("ALBERT_JAX_KILL_SEED", np.random.SeedSequence().entropy % 10**6))
  print(f"kill schedule seed: {seed} (replay with ALBERT_JAX_KILL_SEED={seed})", flush=True)
  rng = np.random.default_rng(seed)
  cache = tmp_path / "compilation_cache"
  shared = [f"--config.compilation_cache_dir={cache}"]  # the victim starts with the step compiled

  reference = cli(tmp_path / "reference", *KILL_RUN, *shared)
  assert reference.returncode == 0, reference.stderr
  entries = sorted(p for p in cache.iterdir() if p.name.endswith("-cache"))
  step_entry = next(p for p in entries if p.name.startswith("jit_train_step-"))

  victim = tmp_path / "victim"
  kinds = [kind for kind, n in KILLS.items() for _ in range(n)]
  rng.shuffle(kinds)
  log, saved, cut_stamp = [], None, None  # cut_stamp: the step's cache entry as the test cut it, while it is there
  for number, kind in enumerate(kinds):
    context = f"seed {seed}, kill {number + 1}/{len(kinds)} ({kind}) after:\n" + "\n".join(log)
    if kind == "restore" and saved is None:
      kind = "save"  # nothing to restore yet
    if kind == "cache":  # this launch compiles the step again (as after a jax upgrade), maybe more
      for entry in entries:
        if entry == step_entry or rng.random() < 0.3:
          entry.unlink(missing_ok=True)
    was_cut = cut_stamp is not None and stamp(step_entry) == cut_stamp
    launch = Launch(cli(victim, *KILL_RUN, *shared, wait=False))
    launches.append(launch)
    where = kill_at_a_moment(launch, kind, rng, victim / "checkpoints", step_entry, context)
    check_cut_entry_removed(launch, was_cut, context)
    if kind == "cache" and step_entry.exists() and rng.random() < 0.75:
      # A kill lands inside jax's in-place write only within microseconds of the file appearing: leave the entry
      # as such a kill would, a prefix of its bytes (possibly none).
      data = step_entry.read_bytes()
      step_entry.write_bytes(data[:int(rng.integers(0, max(len(data), 1)))])
      cut_stamp = stamp(step_entry)
      where += f", entry cut to {cut_stamp[0]} of {len(data)} bytes"
    now = latest_step(victim)
    assert saved is None or (now is not None and now >= saved), f"{context}\nstep {saved} was lost (now {now})"
    saved = now
    log.append(f"{number + 1:2d} {where} | checkpoint {saved}")
  context = f"seed {seed}; kills:\n" + "\n".join(log)
  print(context, flush=True)

  was_cut = cut_stamp is not None and stamp(step_entry) == cut_stamp
  final = Launch(cli(victim, *KILL_RUN, *shared, wait=False))
  launches.append(final)
  assert final.finish() == 0, f"{context}\nthe last launch failed:\n{final.output()}"
  check_cut_entry_removed(final, was_cut, context)
  # No kill left a damaged checkpoint or a compilation-cache entry that jax fails to read.
  for launch in launches:
    for problem in ("cannot be read", "unreadable", "Error reading persistent compilation cache", "Traceback"):
      assert not launch.saw(problem), f"{context}\n{launch.output()}"
  # The same final parameters, bit for bit.
  step_a, params_a = final_params(tmp_path / "reference")
  step_b, params_b = final_params(victim)
  assert step_a == step_b == STEPS, context
  assert_trees_equal(params_a, params_b)
  # Every record logged, in any launch, equals the uninterrupted run's record for its step (timing fields aside):
  # the steps after the restored checkpoint are logged again, with the same values; no step is missing.
  expected = {r["step"]: without_timing(r) for r in records(tmp_path / "reference")}
  assert sorted(expected) == list(range(1, STEPS + 1))
  got = records(victim)
  for record in got:
    assert without_timing(record) == expected[record["step"]], f"{context}\n{record}"
  assert {r["step"] for r in got} == set(expected), context
  # Nothing left over: no lock, no temporary directory or file, only complete checkpoints that read back.
  assert not (victim / "run.lock").exists(), context
  leftovers = [p for p in victim.rglob("*") if TMP_MARK in p.name or p.name.endswith(".tmp")]
  assert not leftovers, (context, leftovers)
  ckpt = checkpointing.Checkpointer(str(victim / "checkpoints"), 1, 1)
  assert sorted(p.name for p in (victim / "checkpoints").iterdir()) == sorted(map(str, ckpt.all_steps())), context
  assert ckpt.all_steps()[-1] == STEPS
  for step in ckpt.all_steps():
    ckpt.restore_params(step)
  # The compilation cache holds only entries that read back whole.
  for entry in cache.glob("*-cache"):
    compilation_cache.decompress_executable(entry.read_bytes())
