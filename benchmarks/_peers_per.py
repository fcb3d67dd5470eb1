"""Workloads and contenders of ``bench_per.py`` (prioritized replay): ``ding_buffer`` advanced on tensor storage,
cpprb ``PrioritizedReplayBuffer``, TorchRL ``TensorDictPrioritizedReplayBuffer``, DI-engine's
``AdvancedReplayBuffer`` (the real one, when ``ding`` imports) and, for image transitions, a plain numpy uniform
gather. Every builder returns a filled :class:`Contender`; ``fill_only`` builders are used by the memory
measurement (``bench_per.py --mem-child``), which must construct and fill exactly as the timing run does.
"""

import itertools
import os
import shutil
import tempfile
import time
import warnings
from typing import Any, Callable, Dict, List, NamedTuple, Optional

import numpy as np
import torch
from bench_naive import make_chunk  # CartPole-like batch arrays: obs f32[4], action i64, reward f32, next_obs, done

BATCH = 256  # sample / update size
PUSH_BATCH = 64  # transitions per batched push
DQN_PUSHES = 4  # single pushes per DQN-loop iteration
ALPHA, BETA = 0.6, 0.4
IMAGE_SHAPE = (4, 84, 84)
POOL_SAMPLES = 32  # pre-drawn samples cycled through by the ``update`` measurement
POOL_PRIOS = 64  # distinct new-priority vectors cycled through by update / DQN loop

OURS = 'ding_buffer advanced (tensor)'
CPPRB = 'cpprb PrioritizedReplayBuffer'
TORCHRL = 'TorchRL TensorDictPrioritizedReplayBuffer'
DIENGINE = 'DI-engine AdvancedReplayBuffer'
NUMPY = 'numpy uniform gather'

# op key -> (table label, items per call for the rate)
OPS = {
    'push64': ('push 64, batch (transitions/s)', PUSH_BATCH),
    'push1': ('single push (transitions/s)', 1),
    'sample': ('sample 256 with IS (batches/s)', 1),
    'update': ('update 256 priorities (batches/s)', 1),
    'dqn': ('DQN loop: 4 push + sample + update (loops/s)', 1),
}


# ---------------------------------------------------------------------------------------------- workload
class Workload(NamedTuple):
    kind: str  # 'cartpole' | 'image'
    capacity: int
    source: Dict[str, np.ndarray]  # fill chunk, written repeatedly until the buffer is full
    batches: List[Dict[str, np.ndarray]]  # distinct push batches of PUSH_BATCH
    items: List[Dict[str, Any]]  # distinct single transitions as a gym loop makes them
    prios: List[np.ndarray]  # distinct new-priority vectors (float32 [BATCH])


def make_image_chunk(rng: np.random.Generator, n: int) -> Dict[str, np.ndarray]:
    return {
        'obs': rng.integers(0, 256, size=(n, *IMAGE_SHAPE), dtype=np.uint8),
        'action': rng.integers(0, 6, size=n, dtype=np.int64),
        'reward': rng.standard_normal(n, dtype=np.float32),
        'next_obs': rng.integers(0, 256, size=(n, *IMAGE_SHAPE), dtype=np.uint8),
        'done': rng.random(n) < 0.01,
    }


def gym_items(chunk: Dict[str, np.ndarray], start: int = 0, stop: Optional[int] = None) -> List[Dict[str, Any]]:
    """One fresh dict per transition, as a gym loop produces it: own numpy arrays for obs / next_obs, a Python
    int action, float reward and bool done."""
    obs, act, rew, nxt, done = (chunk[k] for k in ('obs', 'action', 'reward', 'next_obs', 'done'))
    stop = len(obs) if stop is None else stop
    return [
        {
            'obs': obs[i].copy(),
            'action': int(act[i]),
            'reward': float(rew[i]),
            'next_obs': nxt[i].copy(),
            'done': bool(done[i]),
        }
        for i in range(start, stop)
    ]


def make_workload(kind: str, capacity: int, seed: int, fill_chunk: int, pool_batches: int) -> Workload:
    rng = np.random.default_rng(seed)
    make = make_chunk if kind == 'cartpole' else make_image_chunk
    source = make(rng, min(fill_chunk, capacity))
    batches = [make(rng, PUSH_BATCH) for _ in range(pool_batches)]
    items = [item for b in batches for item in gym_items(b)]
    prios = [(rng.random(BATCH, dtype=np.float32) * 2 + 0.01) for _ in range(POOL_PRIOS)]
    return Workload(kind, capacity, source, batches, items, prios)


def fill_slices(capacity: int, chunk: int):
    """(start, n) of the fill writes: ``chunk`` rows at a time up to ``capacity``."""
    for start in range(0, capacity, chunk):
        yield start, min(chunk, capacity - start)


def head(batch: Dict[str, np.ndarray], n: int) -> Dict[str, np.ndarray]:
    return {k: v[:n] for k, v in batch.items()}


def _cycle(pool: List[Any]) -> Callable[[], Any]:
    it = itertools.cycle(pool)
    return lambda: next(it)


# ---------------------------------------------------------------------------------------------- contender
class Contender(NamedTuple):
    name: str
    ops: Dict[str, Any]  # op key -> zero-arg callable, or a str shown instead of a number ('n/a')
    refresh: Callable[[], None]  # re-draws the update pool (call after pushes, before timing ``update``)
    release: Callable[[], None]  # drops the buffer (and whatever threads / files it holds)
    notes: List[str]
    info: Dict[str, Any]  # fill time, filled count


def _pool_refresher(draw: Callable[[], Any], pool: List[Any]) -> Callable[[], None]:
    def refresh() -> None:
        pool[:] = [draw() for _ in range(POOL_SAMPLES)]

    refresh()
    return refresh


# ---------------------------------------------------------------------------------------------- ours
def ours_buffer(capacity: int):
    from ding_buffer import _numba, create_buffer

    _numba.load()  # steady state: compiled kernels loaded before anything is timed (they load in the background)
    return create_buffer(
        dict(type='advanced', replay_buffer_size=capacity, alpha=ALPHA, beta=BETA, seed=0, storage=dict(type='tensor'))
    )


def ours_fill(buf, w: Workload) -> None:
    for _, n in fill_slices(w.capacity, len(w.source['obs'])):
        buf.extend(head(w.source, n))
    assert buf.count() == w.capacity


def build_ours(w: Workload) -> Contender:
    t0 = time.perf_counter()
    buf = ours_buffer(w.capacity)
    ours_fill(buf, w)
    fill_s = time.perf_counter() - t0
    ops, refresh = ours_ops(buf, w)
    notes = [
        '`extend(batch dict of arrays)`, `push(gym dict)`, `sample(256)` -> dict of batched tensors incl. IS, '
        '`update({replay_unique_id, replay_buffer_idx, priority})` with the sampled tensors and a float32 '
        'tensor of new priorities; beta anneals from 0.4 (default anneal_step 1e5, as DI-engine)'
    ]
    return Contender(OURS, ops, refresh, lambda: None, notes, {'fill_s': fill_s, 'filled': buf.count()})


def ours_ops(buf, w: Workload):
    """The timed operations of a filled ``advanced`` buffer ``buf`` and the refresher of its update pool (drawn
    once here)."""
    next_batch, next_item = _cycle(w.batches), _cycle(w.items)
    next_prio = _cycle([torch.from_numpy(p) for p in w.prios])  # a learner's |td error| is a tensor
    pool: List[Any] = []
    refresh = _pool_refresher(lambda: buf.sample(BATCH), pool)
    counter = itertools.count()

    def update(s) -> None:
        buf.update(
            {
                'replay_unique_id': s['replay_unique_id'],
                'replay_buffer_idx': s['replay_buffer_idx'],
                'priority': next_prio(),
            }
        )

    def dqn() -> None:
        for _ in range(DQN_PUSHES):
            buf.push(next_item())
        update(buf.sample(BATCH))

    ops = {
        'push64': lambda: buf.extend(next_batch()),
        'push1': lambda: buf.push(next_item()),
        'sample': lambda: buf.sample(BATCH),
        'update': lambda: update(pool[next(counter) % len(pool)]),
        'dqn': dqn,
    }
    return ops, refresh


# ---------------------------------------------------------------------------------------------- cpprb
def cpprb_buffer(capacity: int, w: Workload):
    import cpprb

    obs_shape = w.source['obs'].shape[1:]
    obs_dtype = w.source['obs'].dtype
    env_dict = {
        'obs': {'shape': obs_shape, 'dtype': obs_dtype},
        'action': {'dtype': np.int64},
        'reward': {'dtype': np.float32},
        'next_obs': {'shape': obs_shape, 'dtype': obs_dtype},
        'done': {'dtype': np.bool_},
    }
    return cpprb.PrioritizedReplayBuffer(capacity, env_dict, alpha=ALPHA)


def cpprb_fill(buf, w: Workload) -> None:
    for _, n in fill_slices(w.capacity, len(w.source['obs'])):
        buf.add(**head(w.source, n))
    assert buf.get_stored_size() == w.capacity


def build_cpprb(w: Workload) -> Contender:
    t0 = time.perf_counter()
    buf = cpprb_buffer(w.capacity, w)
    cpprb_fill(buf, w)
    fill_s = time.perf_counter() - t0
    next_batch, next_item, next_prio = _cycle(w.batches), _cycle(w.items), _cycle(w.prios)
    pool: List[Any] = []
    refresh = _pool_refresher(lambda: buf.sample(BATCH, beta=BETA)['indexes'], pool)
    counter = itertools.count()

    def dqn() -> None:
        for _ in range(DQN_PUSHES):
            buf.add(**next_item())
        s = buf.sample(BATCH, beta=BETA)
        buf.update_priorities(s['indexes'], next_prio())

    ops = {
        'push64': lambda: buf.add(**next_batch()),
        'push1': lambda: buf.add(**next_item()),
        'sample': lambda: buf.sample(BATCH, beta=BETA),
        'update': lambda: buf.update_priorities(pool[next(counter) % len(pool)], next_prio()),
        'dqn': dqn,
    }
    notes = [
        '`add(**batch)`, `add(**gym dict)`, `sample(256, beta=0.4)` -> dict of numpy arrays incl. weights and '
        'indexes, `update_priorities(indexes, numpy priorities)`; no id check on update, fixed beta'
    ]
    return Contender(CPPRB, ops, refresh, lambda: None, notes, {'fill_s': fill_s, 'filled': buf.get_stored_size()})


# ---------------------------------------------------------------------------------------------- TorchRL
def _td(chunk: Dict[str, Any], batched: bool = True):
    from tensordict import TensorDict

    data = {k: torch.as_tensor(v) for k, v in chunk.items()}
    return TensorDict(data, batch_size=[len(chunk['obs'])] if batched else [])


def torchrl_buffer(capacity: int):
    from torchrl.data import LazyTensorStorage, TensorDictPrioritizedReplayBuffer

    return TensorDictPrioritizedReplayBuffer(
        alpha=ALPHA, beta=BETA, storage=LazyTensorStorage(capacity), batch_size=BATCH, priority_key='td_error'
    )


def torchrl_fill(buf, w: Workload, source_td=None) -> None:
    source_td = _td(w.source) if source_td is None else source_td
    for _, n in fill_slices(w.capacity, len(w.source['obs'])):
        buf.extend(source_td[:n])
    assert len(buf) == w.capacity


def build_torchrl(w: Workload) -> Contender:
    t0 = time.perf_counter()
    buf = torchrl_buffer(w.capacity)
    torchrl_fill(buf, w)
    fill_s = time.perf_counter() - t0
    td_batches = [_td(b) for b in w.batches]
    td_items = [_td(item, batched=False) for item in w.items]
    next_batch, next_item = _cycle(td_batches), _cycle(td_items)
    next_prio = _cycle([torch.from_numpy(p) for p in w.prios])
    pool: List[Any] = []
    refresh = _pool_refresher(lambda: buf.sample()['index'], pool)
    counter = itertools.count()

    def dqn() -> None:
        for _ in range(DQN_PUSHES):
            buf.add(next_item())
        s = buf.sample()
        buf.update_priority(s['index'], next_prio())

    ops = {
        'push64': lambda: buf.extend(next_batch()),
        'push1': lambda: buf.add(next_item()),
        'sample': lambda: buf.sample(),
        'update': lambda: buf.update_priority(pool[next(counter) % len(pool)], next_prio()),
        'dqn': dqn,
    }
    notes = [
        'LazyTensorStorage; inputs pre-converted to TensorDicts (batch = TensorDict[64], single = '
        'TensorDict[]); sample -> TensorDict with `index` and `priority_weight`; `update_priority(index, prio)`'
    ]
    return Contender(TORCHRL, ops, refresh, lambda: None, notes, {'fill_s': fill_s, 'filled': len(buf)})


# ---------------------------------------------------------------------------------------------- DI-engine
_DI_COUNTER = itertools.count()
_DI_LOGDIR: Optional[str] = None


def diengine_buffer(capacity: int):
    """The real ``ding.worker.replay_buffer.AdvancedReplayBuffer`` with its default config (alpha 0.6, beta 0.4).
    Its text / TensorBoard loggers write below a temporary directory (they take a path relative to the cwd)."""
    global _DI_LOGDIR
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        from ding.worker.replay_buffer import AdvancedReplayBuffer
    if _DI_LOGDIR is None:
        _DI_LOGDIR = tempfile.mkdtemp(prefix='bench_per_ding_')
    cfg = AdvancedReplayBuffer.default_config()
    cfg.replay_buffer_size = capacity
    cfg.alpha, cfg.beta = ALPHA, BETA
    exp_name = os.path.relpath(_DI_LOGDIR)
    return AdvancedReplayBuffer(cfg, exp_name=exp_name, instance_name=f'buffer{next(_DI_COUNTER)}')


def diengine_release(buf) -> None:
    """Stop its monitor thread and loggers without ``close()`` (which clears item by item: seconds at 1e6)."""
    buf._end_flag = True
    buf._periodic_thruput_monitor.close()
    buf._tb_logger.flush()
    buf._tb_logger.close()


def diengine_cleanup() -> None:
    if _DI_LOGDIR is not None:
        shutil.rmtree(_DI_LOGDIR, ignore_errors=True)


def diengine_fill(buf, w: Workload, budget_s: float) -> Dict[str, Any]:
    """Push fresh gym dicts (they become the stored items) as lists of ``len(source)``; stop early once
    ``budget_s`` is spent. Returns the fill time and count."""
    t0 = time.perf_counter()
    chunk = len(w.source['obs'])
    for _, n in fill_slices(w.capacity, chunk):
        buf.push(gym_items(w.source, 0, n), 0)
        if time.perf_counter() - t0 > budget_s:
            break
    return {'fill_s': time.perf_counter() - t0, 'filled': buf.count()}


def build_diengine(w: Workload, budget_s: float) -> Contender:
    buf = diengine_buffer(w.capacity)
    info = diengine_fill(buf, w, budget_s)
    next_item, next_prio = _cycle(w.items), _cycle([p.tolist() for p in w.prios])
    batch_lists = [gym_items(b) for b in w.batches]
    next_list = _cycle(batch_lists)

    def info_of(data: List[Dict[str, Any]], prio: List[float]) -> Dict[str, List[Any]]:
        return {
            'replay_unique_id': [d['replay_unique_id'] for d in data],
            'replay_buffer_idx': [d['replay_buffer_idx'] for d in data],
            'priority': prio,
        }

    pool: List[Any] = []
    refresh = _pool_refresher(lambda: info_of(buf.sample(BATCH, 0), next_prio()), pool)
    counter = itertools.count()

    def dqn() -> None:
        for _ in range(DQN_PUSHES):
            buf.push(dict(next_item()), 0)
        buf.update(info_of(buf.sample(BATCH, 0), next_prio()))

    ops = {
        'push64': lambda: buf.push([dict(d) for d in next_list()], 0),
        'push1': lambda: buf.push(dict(next_item()), 0),
        'sample': lambda: buf.sample(BATCH, 0),
        'update': lambda: buf.update(pool[next(counter) % len(pool)]),
        'dqn': dqn,
    }
    notes = [
        'the real DI-engine 0.5.3 class (numba segment trees), default config; stores the pushed dicts and '
        'mutates them, so every timed push passes a fresh shallow copy (`dict(item)`, ~0.1 us, included); '
        'push 64 = `push(list of 64 dicts)`; sample returns the stored dicts (no collation to a batch, which '
        'a learner would still need); update takes lists (ids / idx gathered from the sampled dicts, '
        'priorities as `tolist()`), timed update uses pre-built lists; logs its sampled-data table every 200 '
        'samples as by default (stderr + a file in a temp dir; ding_buffer\'s loggers are kept at WARNING)'
    ]
    if info['filled'] < w.capacity:
        notes.append(f"filled to {info['filled']:,} of {w.capacity:,} only (fill time budget)")
    return Contender(DIENGINE, ops, refresh, lambda: diengine_release(buf), notes, info)


# ---------------------------------------------------------------------------------------------- numpy
def build_numpy_gather(w: Workload) -> Contender:
    """The physical reference: preallocated obs / next_obs arrays of the buffer's size and nothing else.
    sample = ``arr[np.random.randint(0, n, 256)]`` for each; a single push writes a gym item's obs and next_obs at
    the next row; the DQN loop is 4 such pushes and a sample (no priorities, ids or other fields)."""
    t0 = time.perf_counter()
    n = w.capacity
    obs = np.empty((n, *w.source['obs'].shape[1:]), dtype=w.source['obs'].dtype)
    nxt = np.empty_like(obs)
    for start, k in fill_slices(n, len(w.source['obs'])):
        obs[start : start + k] = w.source['obs'][:k]
        nxt[start : start + k] = w.source['next_obs'][:k]
    fill_s = time.perf_counter() - t0
    next_item = _cycle(w.items)
    row = itertools.count()

    def sample():
        idx = np.random.randint(0, n, BATCH)
        return obs[idx], nxt[idx]

    def push1():
        item, j = next_item(), next(row) % n
        obs[j] = item['obs']
        nxt[j] = item['next_obs']

    def dqn():
        for _ in range(DQN_PUSHES):
            push1()
        sample()

    ops = {op: 'n/a' for op in OPS}
    ops.update(sample=sample, push1=push1, dqn=dqn)
    notes = [
        'baseline: two preallocated numpy arrays (obs, next_obs), `arr[np.random.randint(0, n, 256)]` for each; '
        'single push = one row write of a gym item\'s obs and next_obs; DQN loop = 4 such writes + that sample'
    ]
    return Contender(NUMPY, ops, lambda: None, lambda: None, notes, {'fill_s': fill_s, 'filled': n})


# ---------------------------------------------------------------------------------------------- probes
def probe(name: str) -> Optional[str]:
    """Build a tiny buffer of peer ``name`` and run every operation once; the failure reason or None."""
    try:
        w = make_workload('cartpole', 1024, seed=99, fill_chunk=1024, pool_batches=2)
        c = {CPPRB: build_cpprb, TORCHRL: build_torchrl, OURS: build_ours, DIENGINE: lambda w: build_diengine(w, 60.0)}[
            name
        ](w)
        try:
            for fn in c.ops.values():
                if callable(fn):
                    fn()
        finally:
            c.release()
        return None
    except Exception as e:  # any failure: skip that peer, print why
        reason = f'{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ""}'
        if name == TORCHRL and 'SegmentTree' in reason:
            try:  # the prioritized sampler needs TorchRL's C++ extension: say why it does not load
                import torchrl._torchrl  # noqa: F401
            except Exception as ext:
                reason += f' (import torchrl._torchrl: {type(ext).__name__}: {str(ext)[:160]})'
        return reason
