"""Kernels of the segment trees: small loops over raw arrays, compiled with numba when it is installed.

Layout (see ``segment_tree.py``): a tree of arity ``K`` over ``leaves``; the internal levels live in one flat
array ``nodes``; ``starts[l]`` is where level ``l`` begins (level 1 = parents of leaves, the last level is the
root). Every level is padded to a multiple of ``K`` (with the neutral element), so each node's children are
the ``K`` contiguous entries ``[K*i, K*i + K)`` of the level below -- one cache line of float64 for ``K = 8``.

``op`` codes: ``SUM``, ``MIN``, ``MAX`` and ``MIN_POS`` (minimum over positive leaves; zero or negative leaves
count as +inf -- used when a min tree shares the leaves of a sum tree, where 0 means "empty").

Without numba the batched operations run as numpy code that descends / refreshes the whole batch level by
level with the same floating-point operations in the same order, so both backends give identical trees and
identical samples; the scalar operations then fall back to plain Python loops (correct, slower).
"""

import numpy as np

from ._numba import HAVE_NUMBA, njit, set_fallback

K = 8  # arity
SUM, MIN, MAX, MIN_POS = 0, 1, 2, 3


@njit(cache=True, nogil=True)
def _combine(op, a, b):
    if op == SUM:
        return a + b
    if op == MAX:
        return a if a >= b else b
    return a if a <= b else b


@njit(cache=True, nogil=True)
def _leaf(op, x):
    if op == MIN_POS and x <= 0.0:
        return np.inf
    return x


@njit(cache=True, nogil=True)
def _refresh_path(leaves, nodes, starts, op, i):
    """Recompute the ancestors of leaf ``i``. O(K * levels)."""
    nlev = starts.shape[0]
    child = i // K
    base = child * K
    acc = _leaf(op, leaves[base])
    for j in range(1, K):
        acc = _combine(op, acc, _leaf(op, leaves[base + j]))
    nodes[starts[0] + child] = acc
    for lvl in range(1, nlev):
        below = starts[lvl - 1]
        child = child // K
        base = below + child * K
        acc = nodes[base]
        for j in range(1, K):
            acc = _combine(op, acc, nodes[base + j])
        nodes[starts[lvl] + child] = acc


@njit(cache=True, nogil=True)
def set_one(leaves, nodes, starts, op, i, value):
    leaves[i] = value
    _refresh_path(leaves, nodes, starts, op, i)


@njit(cache=True, nogil=True)
def refresh_many(leaves, nodes, starts, op, idx):
    for t in range(idx.shape[0]):
        _refresh_path(leaves, nodes, starts, op, idx[t])


@njit(cache=True, nogil=True)
def set_many(leaves, nodes, starts, op, idx, values):
    """Write ``values`` at leaves ``idx`` (the last write wins for repeated indices), then refresh."""
    for t in range(idx.shape[0]):
        leaves[idx[t]] = values[t]
    for t in range(idx.shape[0]):
        _refresh_path(leaves, nodes, starts, op, idx[t])


@njit(cache=True, nogil=True)
def reduce_range(leaves, nodes, starts, op, neutral, lo, hi):
    """Reduce leaves ``[lo, hi)``: partial blocks at each level, then move up. O(K * levels)."""
    acc = neutral
    lvl = 0
    while lo < hi:
        while lo < hi and lo % K != 0:
            x = _leaf(op, leaves[lo]) if lvl == 0 else nodes[starts[lvl - 1] + lo]
            acc = _combine(op, acc, x)
            lo += 1
        while lo < hi and hi % K != 0:
            hi -= 1
            x = _leaf(op, leaves[hi]) if lvl == 0 else nodes[starts[lvl - 1] + hi]
            acc = _combine(op, acc, x)
        lo //= K
        hi //= K
        lvl += 1
    return acc


@njit(cache=True, nogil=True, inline='always')
def _step(leaves, nodes, starts, lvl, node, x):
    """One step of the descent from ``node`` into its children on level ``lvl``: the first child with
    ``prefix + child > x`` (strictly-greater rule; zero children are never chosen, exact boundaries go right,
    ``x < 0`` gives the first non-zero child). If none (``x`` at or beyond the subtree's total, e.g. float
    error) it takes the last positive child and sets ``x = inf``, so the descent ends on the last positive
    leaf. Returns (child index, remaining x); (-1, x) when every child is zero."""
    base = node * K
    s = 0.0
    for j in range(K):
        c = leaves[base + j] if lvl == 0 else nodes[starts[lvl - 1] + base + j]
        if c > 0.0 and s + c > x:
            return base + j, x - s
        s += c
    for j in range(K - 1, -1, -1):
        c = leaves[base + j] if lvl == 0 else nodes[starts[lvl - 1] + base + j]
        if c > 0.0:
            return base + j, np.inf
    return -1, x


@njit(cache=True, nogil=True)
def find_one(leaves, nodes, starts, x):
    """Leaf ``i`` with ``prefix(i) <= x < prefix(i + 1)`` (see ``_step``); -1 when every leaf is zero."""
    node = 0
    for lvl in range(starts.shape[0] - 1, -1, -1):
        node, x = _step(leaves, nodes, starts, lvl, node, x)
        if node < 0:
            return -1
    return node


@njit(cache=True, nogil=True)
def find_many(leaves, nodes, starts, xs, out):
    """``find_one`` for every query, level-major: all queries take one step down before any takes the next,
    so the (independent) cache misses of different queries overlap instead of forming one dependent chain per
    query -- 5-10x faster on trees larger than the cache."""
    n = xs.shape[0]
    x = xs.copy()
    for t in range(n):
        out[t] = 0
    for lvl in range(starts.shape[0] - 1, -1, -1):
        for t in range(n):
            if out[t] >= 0:
                out[t], x[t] = _step(leaves, nodes, starts, lvl, out[t], x[t])


@njit(cache=True, nogil=True)
def _prio_node(leaves, snodes, mnodes, xnodes, has_max, starts, lvl, node):
    """Recompute node ``node`` of internal level ``lvl + 1`` of the fused sum / min-positive / max trees."""
    base = node * K
    if lvl == 0:
        x = leaves[base]
        s = x
        m = x if x > 0.0 else np.inf
        mx = x
        for j in range(1, K):
            x = leaves[base + j]
            s += x
            if x > 0.0 and x < m:
                m = x
            if x > mx:
                mx = x
    else:
        below = starts[lvl - 1] + base
        s = snodes[below]
        m = mnodes[below]
        mx = xnodes[below] if has_max else 0.0
        for j in range(1, K):
            s += snodes[below + j]
            if mnodes[below + j] < m:
                m = mnodes[below + j]
            if has_max and xnodes[below + j] > mx:
                mx = xnodes[below + j]
    at = starts[lvl] + node
    snodes[at] = s
    mnodes[at] = m
    if has_max:
        xnodes[at] = mx


@njit(cache=True, nogil=True)
def _prio_level(leaves, snodes, mnodes, xnodes, has_max, starts, lvl, parents):
    """Recompute the first ``parents`` nodes of internal level ``lvl + 1`` -- ``_prio_node`` for each, with the
    same additions and comparisons in the same order (identical bits, tested), as branch-free loops over
    contiguous memory: a whole level of a million leaves in about a millisecond (5x the node-by-node loop).
    Kept apart from ``_prio_node`` on purpose: written as one range function, the scattered single-node refresh
    of every sample measured 2x slower."""
    at0 = starts[lvl]
    if lvl == 0:
        for node in range(parents):
            base = node * K
            x = leaves[base]
            s = x
            m = x if x > 0.0 else np.inf
            mx = x
            for j in range(1, K):
                x = leaves[base + j]
                s += x
                v = x if x > 0.0 else np.inf
                m = v if v < m else m
                mx = x if x > mx else mx
            snodes[at0 + node] = s
            mnodes[at0 + node] = m
            if has_max:
                xnodes[at0 + node] = mx
        return
    b0 = starts[lvl - 1]
    for node in range(parents):
        below = b0 + node * K
        s = snodes[below]
        m = mnodes[below]
        for j in range(1, K):
            s += snodes[below + j]
            v = mnodes[below + j]
            m = v if v < m else m
        snodes[at0 + node] = s
        mnodes[at0 + node] = m
    if has_max:
        for node in range(parents):
            below = b0 + node * K
            mx = xnodes[below]
            for j in range(1, K):
                v = xnodes[below + j]
                mx = v if v > mx else mx
            xnodes[at0 + node] = mx


@njit(cache=True, nogil=True)
def prio_refresh(leaves, snodes, mnodes, xnodes, has_max, starts, idx, n):
    """Refresh sum, min (over positive leaves) and max above the leaves ``idx[:n]`` in one level-major pass (the
    children block is read once for all trees; misses of different leaves overlap). A level with no more parent
    nodes than updates is recomputed whole: the ancestors shared near the root are then computed once instead of
    once per update. Every node is recomputed from its children in a fixed order, so the result does not depend
    on how updates were grouped (eager and deferred refreshes give identical bits)."""
    nodes = idx[:n] // K
    below = leaves.shape[0]  # size of the level below the one being refreshed
    for lvl in range(starts.shape[0]):
        parents = below // K
        if parents <= n:
            _prio_level(leaves, snodes, mnodes, xnodes, has_max, starts, lvl, parents)
        else:
            for t in range(n):
                _prio_node(leaves, snodes, mnodes, xnodes, has_max, starts, lvl, nodes[t])
        nodes //= K
        below = (starts[lvl + 1] if lvl + 1 < starts.shape[0] else snodes.shape[0]) - starts[lvl]


@njit(cache=True, nogil=True)
def prio_set_many(leaves, snodes, mnodes, xnodes, has_max, starts, idx, values):
    """``PriorityTree.set`` done at once: write the leaves (the last write wins for repeats), then refresh."""
    n = idx.shape[0]
    for t in range(n):
        leaves[idx[t]] = values[t]
    prio_refresh(leaves, snodes, mnodes, xnodes, has_max, starts, idx, n)


@njit(cache=True, nogil=True)
def _defer(leaves, snodes, mnodes, xnodes, has_max, starts, idx, n, pending, npending):
    """Record leaves ``idx[:n]`` (already written) as waiting for their ancestors' refresh; when ``pending`` would
    overflow, refresh what waits first (and refresh a batch larger than ``pending`` at once)."""
    k = npending[0]
    if k + n > pending.shape[0]:
        if k:
            prio_refresh(leaves, snodes, mnodes, xnodes, has_max, starts, pending, k)
            npending[0] = 0
            k = 0
        if n > pending.shape[0]:
            prio_refresh(leaves, snodes, mnodes, xnodes, has_max, starts, idx, n)
            return
    for t in range(n):
        pending[k + t] = idx[t]
    npending[0] = k + n


@njit(cache=True, nogil=True)
def prio_set_lazy(leaves, snodes, mnodes, xnodes, has_max, starts, idx, values, pending, npending):
    """Write the leaves now and leave their ancestors for ``prio_flush`` (the next read of a tree): a run of
    writes between two reads pays one refresh, with the shared ancestors computed once."""
    n = idx.shape[0]
    for t in range(n):
        leaves[idx[t]] = values[t]
    _defer(leaves, snodes, mnodes, xnodes, has_max, starts, idx, n, pending, npending)


@njit(cache=True, nogil=True)
def prio_fill_lazy(leaves, snodes, mnodes, xnodes, has_max, starts, idx, value, pending, npending):
    """``prio_set_lazy`` of one ``value`` at every leaf of ``idx`` (a batched push of items without priorities)."""
    n = idx.shape[0]
    for t in range(n):
        leaves[idx[t]] = value
    _defer(leaves, snodes, mnodes, xnodes, has_max, starts, idx, n, pending, npending)


@njit(cache=True, nogil=True)
def prio_flush(leaves, snodes, mnodes, xnodes, has_max, starts, pending, npending):
    """Refresh the ancestors of every leaf written since the last flush."""
    k = npending[0]
    if k:
        prio_refresh(leaves, snodes, mnodes, xnodes, has_max, starts, pending, k)
        npending[0] = 0


@njit(cache=True, nogil=True)
def prio_update_by_id(
    leaves,
    snodes,
    mnodes,
    xnodes,
    has_max,
    starts,
    pending,
    npending,
    valid,
    next_uid,
    capacity,
    slots,
    ids,
    prios,
    eps,
    alpha,
    max_prio,
    out,
):
    """A prioritized ``update`` in one compiled pass, all or nothing: check every entry first (slot in
    ``[0, capacity)``, priority in ``[0, max_prio]`` -- NaN fails), then keep the entries whose slot still holds
    their id (valid, and the slot's id -- the newest ``u < next_uid`` with ``u % capacity == slot`` -- equals it),
    write ``(priority + eps) ** alpha`` at their leaves (the last write wins for repeats) and leave the trees'
    refresh to the next read (``prio_flush``; ``pending`` / ``npending`` as in ``prio_set_lazy``).
    ``out`` receives ``(entries updated, largest updated priority or -1, index of the first bad entry or -1,
    1: bad slot / 2: bad priority)``; on a bad entry nothing is written."""
    n = slots.shape[0]
    for t in range(n):
        if slots[t] < 0 or slots[t] >= capacity:
            out[2], out[3] = t, 1
            return
        if not (prios[t] >= 0.0 and prios[t] <= max_prio):
            out[2], out[3] = t, 2
            return
    last = next_uid - 1
    keep = np.empty(n, np.int64)
    values = np.empty(n, np.float64)
    m = 0
    top = -1.0
    for t in range(n):
        slot = slots[t]
        if valid[slot] and last - (last - slot) % capacity == ids[t]:
            keep[m] = slot
            values[m] = (prios[t] + eps) ** alpha
            if prios[t] > top:
                top = prios[t]
            m += 1
    for t in range(m):
        leaves[keep[t]] = values[t]
    if m:
        _defer(leaves, snodes, mnodes, xnodes, has_max, starts, keep, m, pending, npending)
    out[0], out[1], out[2], out[3] = m, top, -1, 0


@njit(cache=True, nogil=True)
def prio_draw(
    leaves,
    snodes,
    mnodes,
    xnodes,
    has_max,
    starts,
    pending,
    npending,
    u,
    counts,
    next_uid,
    capacity,
    slots,
    drawn,
    use,
    ids,
):
    """A prioritized draw in one pass (``PriorityIndex.draw``): refresh what waits, then for ``n = len(u)``
    strata the leaf at ``(t + u[t]) / n * total`` (``find_many``'s descent), its value (``drawn``), its use
    count after this draw (``counts`` bumped in order, as ``bump_counts``) and the id of the item in its slot
    (``ids``: the newest ``u < next_uid`` with ``u % capacity == slot``, as ``RingIndex.uids``). Returns the smallest
    positive leaf,
    0.0 when the total is not positive and -1.0 when a descent found only zero leaves (nothing counted in both
    cases). The powers of the leaves are left to numpy, which vectorises them (a scalar ``pow`` per item costs
    more than the whole descent)."""
    if npending[0]:
        prio_refresh(leaves, snodes, mnodes, xnodes, has_max, starts, pending, npending[0])
        npending[0] = 0
    total = snodes[snodes.shape[0] - 1]
    if not total > 0.0:
        return 0.0
    n = u.shape[0]
    x = np.empty(n)
    for t in range(n):
        x[t] = (t + u[t]) / n * total
        slots[t] = 0
    for lvl in range(starts.shape[0] - 1, -1, -1):
        for t in range(n):
            if slots[t] >= 0:
                slots[t], x[t] = _step(leaves, snodes, starts, lvl, slots[t], x[t])
    for t in range(n):
        if slots[t] < 0:
            return -1.0  # every leaf zero below a positive node: a corrupt tree
    last = next_uid - 1
    for t in range(n):
        slot = slots[t]
        drawn[t] = leaves[slot]
        counts[slot] += 1
        use[t] = counts[slot]
        ids[t] = last - (last - slot) % capacity
    return mnodes[mnodes.shape[0] - 1]


@njit(cache=True, nogil=True)
def prio_set_one(leaves, snodes, mnodes, xnodes, has_max, starts, i, value):
    leaves[i] = value
    node = i // K
    for lvl in range(starts.shape[0]):
        _prio_node(leaves, snodes, mnodes, xnodes, has_max, starts, lvl, node)
        node //= K


@njit(cache=True, nogil=True)
def _leaf_values_loop(prios, add, alpha, out):
    for t in range(prios.shape[0]):
        out[t] = (prios[t] + add) ** alpha


def _leaf_values_py(prios, add, alpha, out):
    out[:] = [(p + add) ** alpha for p in prios.tolist()]


def leaf_values(prios, add, alpha):
    """``(prios + add) ** alpha`` computed with the C library's ``pow`` -- exactly what Python's ``**`` gives for
    one item. ``np.power`` may use a SIMD ``pow`` that differs by one ulp for some inputs, and then equal
    priorities pushed one at a time and in a batch would get different leaves (IS weights no longer exactly 1)."""
    prios = np.ascontiguousarray(prios, dtype=np.float64)
    out = np.empty(len(prios))
    (_leaf_values_loop if HAVE_NUMBA else _leaf_values_py)(prios, float(add), float(alpha), out)
    return out


# ---------------------------------------------------------------------------------------- numpy fallbacks
def _np_level(leaves, nodes, starts, lvl):
    """Values of level ``lvl`` (0 = leaves) as an array view."""
    if lvl == 0:
        return leaves
    end = starts[lvl] if lvl < len(starts) else len(nodes)
    return nodes[starts[lvl - 1] : end]


def _np_reduce_blocks(vals, op):
    acc = vals[:, 0]
    for j in range(1, K):  # sequential, like the compiled kernel, so both give identical bits
        acc = acc + vals[:, j] if op == SUM else (np.maximum if op == MAX else np.minimum)(acc, vals[:, j])
    return acc


def np_refresh_many(leaves, nodes, starts, op, idx):
    parents = np.unique(np.asarray(idx, dtype=np.int64) // K)
    offs = np.arange(K)
    for lvl in range(len(starts)):
        below = _np_level(leaves, nodes, starts, lvl)
        vals = below[parents[:, None] * K + offs]
        if lvl == 0 and op == MIN_POS:
            vals = np.where(vals > 0.0, vals, np.inf)
        nodes[starts[lvl] + parents] = _np_reduce_blocks(vals, op)
        parents = np.unique(parents // K)


def np_set_many(leaves, nodes, starts, op, idx, values):
    idx = np.asarray(idx, dtype=np.int64)
    if len(idx) != len(np.unique(idx)):  # keep the last write of repeated indices, like the loop kernel
        _, first_rev = np.unique(idx[::-1], return_index=True)
        keep = len(idx) - 1 - first_rev
        idx, values = idx[keep], np.asarray(values)[keep]
    leaves[idx] = values
    np_refresh_many(leaves, nodes, starts, op, idx)


def np_find_many(leaves, nodes, starts, xs, out):
    x = np.array(xs, dtype=np.float64)
    node = np.zeros(len(x), dtype=np.int64)
    dead = np.zeros(len(x), dtype=bool)
    rows, offs = np.arange(len(x)), np.arange(K)
    for lvl in range(len(starts) - 1, -1, -1):
        vals = _np_level(leaves, nodes, starts, lvl)[node[:, None] * K + offs]
        cums = np.cumsum(vals, axis=1)  # sequential running sums, as in the kernel
        hit = (cums > x[:, None]) & (vals > 0.0)
        found = hit.any(axis=1)
        chosen = np.argmax(hit, axis=1)
        before = np.where(chosen > 0, cums[rows, np.maximum(chosen - 1, 0)], 0.0)
        pos = vals > 0.0
        dead |= ~found & ~pos.any(axis=1)
        chosen = np.where(found, chosen, K - 1 - np.argmax(pos[:, ::-1], axis=1))
        chosen[dead] = 0  # keep dead rows on a valid path (their result is -1)
        x = np.where(found, x - before, np.inf)
        node = node * K + chosen
    out[:] = np.where(dead, -1, node)


def np_prio_set_many(leaves, snodes, mnodes, xnodes, has_max, starts, idx, values):
    np_set_many(leaves, snodes, starts, SUM, idx, values)
    np_refresh_many(leaves, mnodes, starts, MIN_POS, idx)
    if has_max:
        np_refresh_many(leaves, xnodes, starts, MAX, idx)


def np_prio_set_one(leaves, snodes, mnodes, xnodes, has_max, starts, i, value):
    np_prio_set_many(leaves, snodes, mnodes, xnodes, has_max, starts, np.array([i]), np.array([value]))


def np_prio_set_lazy(leaves, snodes, mnodes, xnodes, has_max, starts, idx, values, pending, npending):
    """Without numba every write refreshes at once (nothing is ever pending)."""
    np_prio_set_many(leaves, snodes, mnodes, xnodes, has_max, starts, idx, values)


def np_prio_fill_lazy(leaves, snodes, mnodes, xnodes, has_max, starts, idx, value, pending, npending):
    np_prio_set_many(leaves, snodes, mnodes, xnodes, has_max, starts, idx, np.full(len(idx), value))


def np_prio_flush(leaves, snodes, mnodes, xnodes, has_max, starts, pending, npending):
    """The numpy writes never defer, but compiled ones may have (the kernels load while a buffer runs)."""
    k = int(npending[0])
    if k:
        idx = pending[:k].copy()
        np_refresh_many(leaves, snodes, starts, SUM, idx)
        np_refresh_many(leaves, mnodes, starts, MIN_POS, idx)
        if has_max:
            np_refresh_many(leaves, xnodes, starts, MAX, idx)
        npending[0] = 0


if not HAVE_NUMBA:  # pragma: no cover - exercised by the no-numba test run
    refresh_many, set_many, find_many = np_refresh_many, np_set_many, np_find_many
    prio_set_many, prio_set_one = np_prio_set_many, np_prio_set_one
    prio_set_lazy, prio_fill_lazy, prio_flush = np_prio_set_lazy, np_prio_fill_lazy, np_prio_flush


@njit(cache=True, nogil=True)
def _bump_counts_loop(counts, idx, out):
    """``counts[idx[t]] += 1`` in order; ``out[t]`` is the count right after that increment (so a slot drawn
    twice in one batch reports 1 then 2, as DI-engine's per-item loop does)."""
    for t in range(idx.shape[0]):
        counts[idx[t]] += 1
        out[t] = counts[idx[t]]


def np_bump_counts(counts, idx, out):
    idx = np.asarray(idx, dtype=np.int64)
    order = np.argsort(idx, kind='stable')
    sorted_idx = idx[order]
    starts = np.r_[True, sorted_idx[1:] != sorted_idx[:-1]]
    group_start = np.maximum.accumulate(np.where(starts, np.arange(len(idx)), 0))
    rank = np.arange(len(idx)) - group_start  # occurrence number within the batch, 0-based
    out[order] = counts[sorted_idx] + rank + 1
    np.add.at(counts, idx, 1)


bump_counts = _bump_counts_loop if HAVE_NUMBA else np_bump_counts

# Until the compiled kernels are loaded (in the background, see ``_numba``) calls go to these: the same results
# (the numpy versions are bit-identical by construction and by test; the scalar ones run as plain Python).
for _kernel, _fallback in (
    (refresh_many, np_refresh_many),
    (set_many, np_set_many),
    (find_many, np_find_many),
    (prio_set_many, np_prio_set_many),
    (prio_set_one, np_prio_set_one),
    (prio_set_lazy, np_prio_set_lazy),
    (prio_fill_lazy, np_prio_fill_lazy),
    (prio_flush, np_prio_flush),
    (_leaf_values_loop, _leaf_values_py),
    (_bump_counts_loop, np_bump_counts),
):
    set_fallback(_kernel, _fallback)
for _kernel in (_combine, _leaf, _refresh_path, set_one, reduce_range, _step, find_one):
    set_fallback(_kernel, 'python')
