"""Small helpers shared by the package, re-exported where DI-engine's code imports them from ``ding.utils``:
``deep_merge_dicts`` and the segment trees (``SegmentTree``, ``SumSegmentTree``, ``MinSegmentTree``)."""

from .config import deep_merge_dicts
from .segment_tree import MaxSegmentTree, MinSegmentTree, SegmentTree, SumSegmentTree

__all__ = ['deep_merge_dicts', 'SegmentTree', 'SumSegmentTree', 'MinSegmentTree', 'MaxSegmentTree']
