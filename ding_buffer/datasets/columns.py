"""Columns: the unit a dataset is read in -- consecutive transitions as a nested dict of arrays with one leading
dimension (``{'obs': {'image': [n, ...]}, 'reward': [n], ...}``), and where each of them ends an episode.

``Chunk`` carries either ``columns`` (HDF5 layouts) or ``rows`` (the pickle layout: a list of transition dicts);
``ends[i]`` says that transition ``i`` is the last one of its episode. The helpers map, slice, concatenate and
split such nested columns; ``Rechunker`` regroups short pieces (one per Minari episode) into chunks of a given size.
"""

from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional

import numpy as np
import torch

Tree = Any  # a numpy array or a dict of Trees


def tree_map(fn: Callable[[np.ndarray], Any], tree: Tree) -> Tree:
    if isinstance(tree, dict):
        return {k: tree_map(fn, v) for k, v in tree.items()}
    return fn(tree)


def tree_leaves(tree: Tree, prefix: str = '') -> Iterator[tuple]:
    """``(dotted name, array)`` of every leaf."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from tree_leaves(v, f'{prefix}.{k}' if prefix else k)
    else:
        yield prefix, tree


def tree_len(tree: Tree) -> int:
    return len(next(tree_leaves(tree))[1])


def tree_concat(trees: List[Tree]) -> Tree:
    if len(trees) == 1:
        return trees[0]
    if isinstance(trees[0], dict):
        return {k: tree_concat([t[k] for t in trees]) for k in trees[0]}
    return np.concatenate(trees)


def to_torch(tree: Tree, copy: bool = False) -> Tree:
    """Columns as torch tensors (sharing the arrays' memory unless ``copy``, or unless a column is stored in the
    other byte order than this machine's, which torch cannot hold: such a column is converted)."""

    def one(a: np.ndarray) -> torch.Tensor:
        if not a.dtype.isnative:
            a = a.astype(a.dtype.newbyteorder('='))
        return torch.from_numpy(np.array(a, copy=True) if copy else np.ascontiguousarray(a))

    return tree_map(one, tree)


def rows_of(columns: Tree) -> List[Dict[str, Any]]:
    """One dict of tensors per row (each a copy, so no item keeps the chunk alive)."""
    tensors = to_torch(columns)
    return [tree_map(lambda t, i=i: t[i].clone(), tensors) for i in range(tree_len(columns))]


@dataclass
class Chunk:
    """Consecutive transitions: ``columns`` (nested arrays ``[n, ...]``) or ``rows`` (dicts), and ``ends`` ``[n]``."""

    ends: np.ndarray
    columns: Optional[Tree] = None
    rows: Optional[List[Any]] = None

    def __len__(self) -> int:
        return len(self.ends)

    def part(self, start: int, stop: Optional[int] = None) -> 'Chunk':
        """Transitions ``[start, stop)``."""
        if self.rows is not None:
            return Chunk(self.ends[start:stop], rows=self.rows[start:stop])
        return Chunk(self.ends[start:stop], columns=tree_map(lambda a: a[start:stop], self.columns))


class Rechunker:
    """Regroups pieces of columns into chunks of ``size`` transitions (the last one shorter)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.pieces: List[Chunk] = []
        self.held = 0

    def add(self, piece: Chunk) -> Iterator[Chunk]:
        self.pieces.append(piece)
        self.held += len(piece)
        while self.held >= self.size:
            whole = self._joined()
            yield whole.part(0, self.size)
            self.held = len(whole) - self.size
            self.pieces = [whole.part(self.size)] if self.held else []

    def flush(self) -> Iterator[Chunk]:
        if self.held:
            yield self._joined()
        self.pieces, self.held = [], 0

    def _joined(self) -> Chunk:
        if len(self.pieces) == 1:
            return self.pieces[0]
        return Chunk(np.concatenate([p.ends for p in self.pieces]), tree_concat([p.columns for p in self.pieces]))
