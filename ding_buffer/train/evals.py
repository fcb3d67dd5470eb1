"""``eval.csv`` of a training run: one row per evaluation, written atomically by the trainer, read by the plots."""

import csv
import io
import os
from typing import Dict, Iterable, List, Sequence

from ..persistence import atomic_text

# return_min / return_max: the range of the evaluation's episodes (the plots keep a +- std band inside it)
EVAL_FIELDS = ('env_step', 'train_iter', 'return_mean', 'return_std', 'wall_time', 'return_min', 'return_max')


def write_eval_csv(run_dir: str, rows: Iterable[Dict[str, float]], fields: Sequence[str] = EVAL_FIELDS) -> None:
    """``eval.csv`` with the columns ``fields`` (the DQN / Ape-X jobs' by default; the HyperGrid job has its own)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    atomic_text(buf.getvalue(), os.path.join(run_dir, 'eval.csv'))


def read_eval_csv(run_dir: str) -> List[Dict[str, float]]:
    path = os.path.join(run_dir, 'eval.csv')
    if not os.path.isfile(path):
        if os.path.isfile(os.path.join(run_dir, 'run.json')):
            raise FileNotFoundError(
                f"'{run_dir}' has no evaluation yet (no eval.csv): the run stopped or is still "
                "before its first evaluation (env.eval_freq)"
            )
        raise FileNotFoundError(f"'{run_dir}' is not a training run directory (no eval.csv)")
    try:
        with open(path) as f:
            # a column a run written by an older version lacks (or left empty) is absent from its rows
            return [{k: float(v) for k, v in row.items() if v not in ('', None)} for row in csv.DictReader(f)]
    except (ValueError, TypeError, csv.Error) as e:  # (a cell that is no number, a row with extra cells, no UTF-8)
        raise ValueError(f"{path} is not an evaluation table of numbers: {type(e).__name__}: {e}") from None
