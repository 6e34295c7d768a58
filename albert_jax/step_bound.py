"""A lower bound on a recipe's step time and hours to train on a TPU slice, from the TPU compiler's cost model.

`compiled.cost_analysis()["optimal_seconds"]` is the compiler's ideal time for one run of the program on one device
(every op at the better of its compute and HBM roofline). It counts a while loop's body once, so the bound is read
from the step compiled with every layer unrolled (straight-line code, each layer counted); a step that accumulates
gradients over k micro batches runs its micro step k times, and the bound counts the whole program k times (the
optimizer update too: a small overcount of its k-1 fewer runs).

The gradient's collectives are bounded by their bytes over the interconnect's all-reduce bandwidth per chip (the
Cloud TPU pages' "all-reduce bandwidth per Pod" over its chips) and, across slices, the data-centre network's
bandwidth per chip. The step bound is the largest of the three (perfect overlap); what it leaves out: the input
pipeline, the host's dispatch, collectives' latency and schedules, and anything the cost model rounds away.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from albert_jax.topology import TpuTopology

# The collectives' bytes in units of an all-reduce's: all-gather and reduce-scatter move half of what an all-reduce
# of the same buffer moves; all-to-all and permutes cross each link once.
_ALL_REDUCE_EQUIVALENT = {"all-reduce": 1.0, "all-gather": 0.5, "reduce-scatter": 0.5, "all-to-all": 0.5,
                          "collective-permute": 0.5}


def optimal_seconds(compiled) -> float | None:
  """The compiler's ideal seconds for one run of `compiled` (loop bodies counted once); None if not reported."""
  costs = compiled.cost_analysis()
  costs = costs[0] if isinstance(costs, (list, tuple)) else costs
  value = (costs or {}).get("optimal_seconds")
  return float(value) if value is not None and value > 0 else None


def layers_in_a_loop(model_config: Any, scan_unroll: int) -> bool:
  """Whether a step compiled at `scan_unroll` layers a scan iteration runs some layers in a while loop, whose body the
  compiler's cost counts once. No loop: no scan (the Python loop), one layer per group (BERT's `sharing=none`), the
  partial-sharing ablation's Python loop, or every layer of a group in one iteration."""
  c = model_config
  groups = c.num_hidden_layers if c.sharing == "none" else c.num_hidden_groups
  return c.scan_layers and c.sharing not in ("attention", "ffn") and scan_unroll < c.num_hidden_layers // groups


def collective_seconds(totals: dict[str, dict[str, int]], topo: TpuTopology) -> tuple[float, float]:
  """(interconnect seconds, data-centre network seconds) a step's collectives need at least, from their bytes per
  device (`compile_stats.CollectiveStats.totals`)."""
  devices_per_chip = topo.devices // topo.chips
  within = sum(_ALL_REDUCE_EQUIVALENT[kind] * split["within_slice"] for kind, split in totals.items())
  across = sum(_ALL_REDUCE_EQUIVALENT[kind] * split["across_slices"] for kind, split in totals.items())
  return (within * devices_per_chip / topo.all_reduce_bytes_per_second_per_chip,
          across * devices_per_chip / topo.dcn_bytes_per_second_per_chip)


@dataclasses.dataclass(frozen=True)
class StepBound:
  """The bound for one compiled setting on one slice (per step: every device runs its share in parallel)."""
  compute_seconds: float      # the compiler's ideal for the whole step, every layer and micro batch counted
  ici_seconds: float          # the collectives within a slice at the interconnect's all-reduce bandwidth
  dcn_seconds: float          # the collectives across slices at the data-centre network's bandwidth
  tokens_per_step: int
  model_flops_per_step: float  # the model's FLOPs (`flops.py`), recomputation not counted
  devices: int
  peak_flops_per_device: float
  train_steps: int

  @property
  def step_seconds(self) -> float:
    return max(self.compute_seconds, self.ici_seconds, self.dcn_seconds)

  @property
  def tokens_per_second(self) -> float:
    return self.tokens_per_step / self.step_seconds

  @property
  def mfu(self) -> float:
    return self.model_flops_per_step / (self.step_seconds * self.devices * self.peak_flops_per_device)

  @property
  def hours(self) -> float:
    return self.train_steps * self.step_seconds / 3600

  def to_dict(self) -> dict[str, float]:
    return {"step_seconds": self.step_seconds, "compute_seconds": self.compute_seconds,
            "ici_seconds": self.ici_seconds, "dcn_seconds": self.dcn_seconds,
            "tokens_per_second": self.tokens_per_second, "mfu": self.mfu, "train_steps": self.train_steps,
            "hours": self.hours}

  def lines(self) -> list[str]:
    limit = max((("compute", self.compute_seconds), ("interconnect", self.ici_seconds),
                 ("data-centre network", self.dcn_seconds)), key=lambda item: item[1])[0]
    return [f"lower bound per step: {self.step_seconds:.4f} s ({limit}-bound; compute {self.compute_seconds:.4f} s, "
            f"interconnect {self.ici_seconds:.4f} s, data-centre network {self.dcn_seconds:.4f} s)",
            f"  at the bound: {self.tokens_per_second:,.0f} tokens/s, MFU {self.mfu:.1%}; the recipe's "
            f"{self.train_steps:,} steps take at least {self.hours:,.1f} h (input pipeline, host and collective "
            "latency not counted)"]
