"""The report of `albert_jax.seeds` (DIR/seeds.json and the table that ends its output): the statistics of the runs
that count, and for a learning-rate grid, every rate's report and the rate whose median is best."""
from __future__ import annotations

import statistics
from typing import Any


def summarize(values: list[float]) -> dict[str, float | None]:
  """Median, mean, sample standard deviation (n - 1; None for one value), min and max."""
  return {"median": statistics.median(values), "mean": statistics.mean(values),
          "std": statistics.stdev(values) if len(values) > 1 else None, "min": min(values), "max": max(values)}


def report(config, slots: list[int], runs: list[dict]) -> dict[str, Any]:
  """seeds.json: every run (collapsed ones kept), and the statistics of the runs that count: each seed's last."""
  from albert_jax.tasks import get_task
  counted = [run for run in runs if run["counted"]]
  task = get_task(config)
  return {"metric": task.metric_name, "higher_is_better": task.higher_is_better, "seeds": slots, "runs": runs,
          "summary": {"seeds": [run["seed"] for run in counted], "collapsed": sum(run["collapsed"] for run in counted),
                      **(summarize([run["value"] for run in counted]) if counted else {})}}


def best_learning_rate(grid: list[dict[str, Any]], higher_is_better: bool) -> float:
  """The learning rate of the `grid` entry (a rate's report) whose counted runs' median is best; the first of a tie."""
  best = max if higher_is_better else min
  return best(grid, key=lambda entry: entry["summary"]["median"])["learning_rate"]


def grid_report(learning_rates: list[float], reports: dict[float, dict]) -> dict[str, Any]:
  """seeds.json of a grid: the best rate's report (`report`), the grid's rates, the best one, and every rate's."""
  grid = [{"learning_rate": rate, **result} for rate, result in reports.items()]
  best = best_learning_rate(grid, grid[0]["higher_is_better"])
  return {**reports[best], "learning_rates": learning_rates, "best_learning_rate": best, "grid": grid}


def _std(summary: dict[str, Any]) -> str:
  return "-" if summary["std"] is None else f"{summary['std']:.4f}"


def grid_table(result: dict[str, Any]) -> str:
  """A grid's report as a table: a row per learning rate with its counted runs' statistics, the chosen one marked."""
  rows = [f"{'rate':>8}  {'runs':>4}  {'median':>8}  {'mean':>8}  {'std':>8}  collapsed  ({result['metric']})"]
  for entry in result["grid"]:
    summary = entry["summary"]
    chosen = "  <- best median" if entry["learning_rate"] == result["best_learning_rate"] else ""
    rows.append(f"{entry['learning_rate']:>8g}  {len(summary['seeds']):>4}  {summary['median']:>8.4f}  "
                f"{summary['mean']:>8.4f}  {_std(summary):>8}  {summary['collapsed']:>9}{chosen}")
  return "\n".join(rows)


def best_run(result: dict[str, Any]) -> str | None:
  """'best run: DIR (seed k, metric v at step n)': the counted run with the best value (the first of a tie), whose
  folder holds the weights to use; None before any run counts."""
  counted = [run for run in result["runs"] if run["counted"]]
  if not counted:
    return None
  run = (max if result["higher_is_better"] else min)(counted, key=lambda run: run["value"])
  return (f"best run: {run['workdir']} (seed {run['seed']}, {result['metric']} {run['value']:.4f} at step "
          f"{run['best_step']})")


def table(result: dict[str, Any]) -> str:
  """The report as a table: a row per run, then the statistics over the runs that count and the best run."""
  rows = [f"{'seed':>10}  {'step':>7}  {result['metric']:>10}  collapsed"]
  for run in result["runs"]:
    note = run["collapse"] or "no"
    note += f" (trained again as seed {run['rerun_as']})" if run["rerun_as"] is not None else ""
    note += "" if run["counted"] else ", not counted"
    rows.append(f"{run['seed']:>10}  {run['best_step']:>7}  {run['value']:>10.4f}  {note}")
  summary = result["summary"]
  if summary["seeds"]:
    rows.append(f"{len(summary['seeds'])} runs: median {summary['median']:.4f}, mean {summary['mean']:.4f}, "
                f"std {_std(summary)}, min {summary['min']:.4f}, max {summary['max']:.4f}; "
                f"{summary['collapsed']} collapsed")
    rows.append(best_run(result))
  return "\n".join(rows)
