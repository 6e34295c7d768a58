"""GLUE's metrics, written out in NumPy so scoring needs no scikit-learn/scipy (tests compare against them).

Definitions as GLUE reports them: accuracy; F1 of the positive class (MRPC, QQP); Matthews correlation in
its multi-class form (Gorodkin 2004, = the binary phi coefficient; 0 when undefined, as scikit-learn); Pearson
and Spearman (Pearson of average ranks, ties share their mean rank) for STS-B.
"""
from __future__ import annotations

import numpy as np


def accuracy(labels, predictions) -> float:
  return float(np.mean(np.asarray(labels) == np.asarray(predictions)))


def f1_binary(labels, predictions) -> float:
  labels, predictions = np.asarray(labels) == 1, np.asarray(predictions) == 1
  tp = np.sum(labels & predictions)
  denominator = 2 * tp + np.sum(~labels & predictions) + np.sum(labels & ~predictions)
  return float(2 * tp / denominator) if denominator else 0.0


def matthews_corrcoef(labels, predictions) -> float:
  labels, predictions = np.asarray(labels), np.asarray(predictions)
  classes, encoded = np.unique(np.concatenate([labels, predictions]), return_inverse=True)
  truth, pred = encoded[:len(labels)], encoded[len(labels):]
  confusion = np.zeros((len(classes), len(classes)), np.float64)
  np.add.at(confusion, (truth, pred), 1)
  t_sum, p_sum = confusion.sum(1), confusion.sum(0)
  n = confusion.sum()
  cov_tp = np.trace(confusion) * n - t_sum @ p_sum
  cov_pp = n * n - p_sum @ p_sum
  cov_tt = n * n - t_sum @ t_sum
  return float(cov_tp / np.sqrt(cov_tt * cov_pp)) if cov_tt * cov_pp else 0.0


def pearson(x, y) -> float:
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  x, y = x - x.mean(), y - y.mean()
  denominator = np.sqrt((x @ x) * (y @ y))
  return float(x @ y / denominator) if denominator else 0.0


def average_ranks(x) -> np.ndarray:
  x = np.asarray(x)
  ranks = np.empty(len(x), np.float64)
  ranks[np.argsort(x, kind="stable")] = np.arange(1, len(x) + 1)
  _, group, counts = np.unique(x, return_inverse=True, return_counts=True)
  return (np.bincount(group, weights=ranks) / counts)[group]


def spearman(x, y) -> float:
  return pearson(average_ranks(x), average_ranks(y))
