"""Code shared by the test modules of every folder (tests/conftest.py puts this folder on ``sys.path``): exact
state comparison, chi-square, references for the sampling and distance parts (a numpy Generator that refuses
population-sized work, the brute-force p-norm distance), waiting with a deadline, the thread-stress runner, MPI
availability, the environment of test subprocesses, the state-corruption tools of the property suites, and
``Case``: one buffer type x storage combination, as the contract suite (tests/buffers/test_contract.py) and the
property suites (tests/test_properties.py, tests/buffers/test_dingengine_properties.py) configure, feed and probe
it."""

import importlib.util
import math
import os
import shutil
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings

from ding_buffer import create_buffer

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
NAN = float('nan')
INF = float('inf')


# ================================================================================ state comparison
def assert_same(a, b, where='state'):
    """Exact recursive equality of states / samples: dicts (same keys), lists and tuples (same type and length),
    tensors and arrays (same dtype, shape and values; NaN equals NaN), scalars (same type; NaN equals NaN)."""
    if isinstance(a, dict):
        assert isinstance(b, dict), f"{where}: {type(b).__name__} is not a dict"
        assert set(a) == set(b), f"{where}: keys {sorted(map(str, a))} != {sorted(map(str, b))}"
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), f"{where}: {a!r} != {b!r}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{where}: {type(b).__name__} is not a tensor"
        assert a.dtype == b.dtype and a.shape == b.shape, (
            f"{where}: {a.dtype}{tuple(a.shape)} != {b.dtype}{tuple(b.shape)}"
        )
        a_, b_ = a.detach().cpu(), b.detach().cpu()
        if a_.is_floating_point() or a_.is_complex():
            same = bool(((a_ == b_) | (torch.isnan(a_) & torch.isnan(b_))).all())
        else:
            same = torch.equal(a_, b_)
        assert same, f"{where}: {a} != {b}"
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a!r} != {b!r}"
        assert np.array_equal(a, b, equal_nan=a.dtype.kind in 'fc'), f"{where}: {a} != {b}"
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), f"{where}: nan != {b!r}"
    else:
        assert type(a) is type(b) and a == b, f"{where}: {a!r} != {b!r}"


def states_equal(a, b):
    """Whether ``assert_same(a, b)`` holds."""
    try:
        assert_same(a, b)
    except AssertionError:
        return False
    return True


def without(state, *keys):
    """``state`` without its top-level entries ``keys``."""
    return {k: v for k, v in state.items() if k not in keys}


# ================================================================================ statistics
def chi_square(counts, expected):
    counts = np.asarray(counts, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    return float(((counts - expected) ** 2 / expected).sum())


def chi_threshold(df):
    """A generous bound on a chi-square statistic with ``df`` degrees of freedom: mean + 5 standard deviations."""
    return df + 5 * math.sqrt(2 * df)


class NoPermutationGenerator(np.random.Generator):
    """A numpy Generator whose O(n) whole-population methods fail loudly (and count calls)."""

    permutation_calls = 0

    def permutation(self, *args, **kwargs):
        NoPermutationGenerator.permutation_calls += 1
        raise AssertionError('permutation() called: O(population) work')

    def choice(self, a, size=None, replace=True, **kwargs):
        # numpy runs Floyd's O(size) algorithm only for a > 10000 and size <= a // 50; anything else shuffles a.
        if replace or not (isinstance(a, (int, np.integer)) and a > 10000 and size * 50 <= a):
            raise AssertionError('choice() called: O(population) work without replacement')
        return super().choice(a, size, replace=False, **kwargs)

    def shuffle(self, *args, **kwargs):
        raise AssertionError('shuffle() called: O(population) work')


def ref_distance(a, b, p):
    """p-norm distance between two representation tuples, in float64, one column at a time."""
    diffs = [abs(float(x) - float(y)) for x, y in zip(a, b)]
    if p == INF:
        m = 0.0
        for d in diffs:
            if d > m:
                m = d
        return m
    s = 0.0
    for d in diffs:
        s += d if p == 1 else d**p
    if p == 1:
        return s
    if p == 2:
        return math.sqrt(s)
    return s ** (1.0 / p)


# ================================================================================ time and threads
def wait_until(predicate, timeout=5.0):
    """Poll ``predicate`` every 10 ms until it holds or ``timeout`` seconds pass; returns its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def run_threads(workers, seconds=None, join_timeout=30.0):
    """The thread-stress runner: every ``worker(stop)`` runs in a thread of its own; ``stop`` (a
    ``threading.Event``) is set after ``seconds`` (``None``: the workers end by themselves). Returns when every
    thread has ended; fails when one is still alive ``join_timeout`` seconds later or when a worker raised (the
    first error is chained, so its traceback is shown)."""
    stop = threading.Event()
    errors = []

    def guarded(worker):
        try:
            worker(stop)
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)
            stop.set()

    threads = [threading.Thread(target=guarded, args=(w,), daemon=True) for w in workers]
    for t in threads:
        t.start()
    try:
        if seconds is not None:
            stop.wait(seconds)
    finally:
        if seconds is not None:
            stop.set()
        deadline = time.monotonic() + join_timeout
        for t in threads:
            t.join(timeout=max(deadline - time.monotonic(), 0.01))
    alive = sum(t.is_alive() for t in threads)
    stop.set()
    assert not alive, f'{alive} of {len(threads)} threads did not finish within {join_timeout}s'
    if errors:
        raise AssertionError(f'{len(errors)} worker(s) raised: {errors[0]!r}') from errors[0]


# ================================================================================ processes
def mpi_missing() -> str:
    """Why MPI jobs cannot run here ('' when mpirun and mpi4py are there)."""
    if shutil.which('mpirun') is None:
        return 'mpirun not found'
    if importlib.util.find_spec('mpi4py') is None:
        return 'mpi4py not installed'
    return ''


def need_mpi() -> None:
    """Skip the calling test without MPI (fail instead under CI, env ``CI``)."""
    why = mpi_missing()
    if why:
        if os.environ.get('CI'):
            pytest.fail(f'MPI tests need Open MPI and mpi4py in CI: {why}')
        pytest.skip(why)


def pythonpath(*first) -> str:
    """A PYTHONPATH for test subprocesses: the folders ``first`` (e.g. the folder of a module they import), this
    folder (the shared helpers), the repository root (the checkout's ``ding_buffer``), then the inherited one."""
    parts = [str(p) for p in first] + [str(TESTS_DIR), str(REPO_ROOT)]
    inherited = os.environ.get('PYTHONPATH')
    return os.pathsep.join(parts + ([inherited] if inherited else []))


def subprocess_env(*first, **extra) -> dict:
    """``os.environ`` with ``pythonpath(*first)`` and ``extra`` (str values) set: for test subprocesses."""
    return dict(os.environ, PYTHONPATH=pythonpath(*first), **extra)


# ================================================================================ property suites
# What a refused call may raise. Anything else (IndexError, KeyError, AttributeError, MemoryError, ...) is a crash.
REFUSALS = (TypeError, ValueError, RuntimeError)

SETTINGS = settings(
    max_examples=50,
    stateful_step_count=50,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


def paths_of(state, prefix=(), depth=0):
    """Every path (tuple of keys / list positions) into ``state``: dict entries and the first entries of lists."""
    out = []
    if depth > 6:
        return out
    if isinstance(state, Mapping):
        for k in state:
            out.append(prefix + (k,))
            out += paths_of(state[k], prefix + (k,), depth + 1)
    elif isinstance(state, list):
        for i in range(min(len(state), 2)):
            out.append(prefix + (i,))
            out += paths_of(state[i], prefix + (i,), depth + 1)
    return out


GARBAGE = (
    'drop',
    'str',
    'none',
    'neg',
    'huge',
    'nan',
    'empty_list',
    'tensor_nan',
    'tensor_short',
    'tensor_dtype',
    'tensor_neg',
    'tensor_big',
)


def garbage_for(value, kind):
    """A replacement of ``value`` (a new object; ``value`` is never modified)."""
    if isinstance(value, torch.Tensor) and kind.startswith('tensor_'):
        v = value.detach().clone()
        if kind == 'tensor_nan':
            v = v.to(torch.float32) if not v.is_floating_point() else v
            if v.numel():
                v.view(-1)[0] = NAN
            return v
        if kind == 'tensor_short':
            return v.reshape(-1)[:-1] if v.numel() else torch.zeros(1)
        if kind == 'tensor_dtype':
            return v.to(torch.int64) if v.is_floating_point() else v.to(torch.float64)
        if kind == 'tensor_neg':
            return -v - 1 if v.dtype != torch.bool else ~v
        return v + 1000 if v.dtype != torch.bool else v
    replacements = {'str': 'garbage', 'none': None, 'neg': -1, 'huge': 2**70, 'nan': NAN, 'empty_list': []}
    return replacements.get(kind, 'garbage')


def corrupted(state, path, kind):
    """A copy of ``state`` with the entry at ``path`` dropped or replaced (containers on the path are copied)."""
    if not path:
        return garbage_for(state, kind)
    head, rest = path[0], path[1:]
    out = dict(state) if isinstance(state, Mapping) else list(state)
    if not rest and kind == 'drop':
        del out[head]
        return out
    out[head] = corrupted(state[head], rest, kind)
    return out


# ================================================================================ the Case model
OBS_DIM = 4  # obs of the items the Case pushes
GFN_DIM = 3  # state dimension of the GFlowNet items
FRAGMENTS_PER_CHUNK = 2  # the chunk buffer's fragments_per_chunk: a pushed "item" is one chunk of fragments
WORKER_SPAN = 10**6  # chunk buffer: item numbers [k * WORKER_SPAN, (k + 1) * WORKER_SPAN) come from worker k
GFN_PRESETS = ('gfn', 'gfn_diverse', 'terminating_state')
EPISODIC_PRESETS = ('episode', 'prioritized_episode')


class Case:
    """One buffer type x storage combination (test id ``preset-storage``; ``preset`` alone for the GFlowNet
    buffers, which have no storage section; ``deque_prio-...`` for the deque with ``priority=True``).

    ``storage``: 'list', 'tensor', 'memmap' (tensor storage with ``memmap_dir``), None (GFlowNet), or for the
    chunk buffer its payload store, 'memory' or 'disk'. ``cap`` is the capacity in items (episodes for the
    episode buffers, chunks for the chunk buffer), ``max_transitions`` that of the episode buffers on tensor
    storage, ``unroll`` the window length of the episode buffers.

    The Case knows how to configure the buffer, what one push of ``n`` items is (items, episodes, GFlowNet dict
    batches, or the chunk buffer's fragments), how to sample it, how to answer a sample with ``update``, and
    what the buffer must refuse (``invalid_pushes``, ``garbage_updates``). A contract check that does not apply
    to a type is skipped through ``require`` with the reason written here (``NOT_APPLICABLE``)."""

    # check -> {preset: why it does not apply}
    NOT_APPLICABLE = {
        'helper threads': {
            'deque': 'the deque wrapper starts no thread (its TensorBoard writes happen inside sample)',
            'chunk': 'the chunk buffer starts no thread (no monitors, no used-data remover)',
        },
    }

    def __init__(self, preset, storage=None, variant=None, cap=16, max_transitions=40, unroll=2):
        self.preset = preset
        self.storage = storage
        self.variant = variant  # 'prio': the deque with priority=True (IS weights, update of the last batch)
        self.cap = cap
        self.max_transitions = max_transitions
        self.unroll = unroll
        self.name = preset if variant is None else f'{preset}_{variant}'
        self.id = self.name if storage is None else f'{self.name}-{storage}'

    def __repr__(self):
        return self.id

    # ------------------------------------------------------------------ what it is
    @property
    def gfn(self):
        return self.preset in GFN_PRESETS

    @property
    def chunk(self):
        return self.preset == 'chunk'

    @property
    def tensor(self):
        """Tensor storage (also memory-mapped)."""
        return self.storage in ('tensor', 'memmap')

    @property
    def fixed_schema(self):
        """The first push fixes a schema (tensor storage, GFlowNet column stores)."""
        return self.tensor or self.gfn

    @property
    def episodic(self):
        return self.preset in EPISODIC_PRESETS

    @property
    def prioritized(self):
        """``update`` takes priorities back (the others' ``update`` is a no-op)."""
        return self.preset in ('advanced', 'prioritized_episode') or self.variant == 'prio'

    @property
    def updates_last_batch(self):
        """``update`` applies to the last sampled batch (the deque): it takes ``{'priority': [...]}`` only, and
        with several samplers another sampler's update may have consumed that batch (the answer is then 0/0)."""
        return self.preset == 'deque'

    @property
    def slots(self):
        """Range of ``replay_buffer_idx``: item slots, or transition slots of the prioritized episode buffer."""
        return self.max_transitions if self.preset == 'prioritized_episode' else self.cap

    @property
    def allow_pickle(self):
        return self.storage == 'list'

    def require(self, check):
        """Skip the calling test where ``check`` does not apply to this type, with the reason."""
        why = self.NOT_APPLICABLE.get(check, {}).get(self.preset)
        if why:
            pytest.skip(f'{self.id}: {check} does not apply: {why}')

    def applies(self, check):
        return self.preset not in self.NOT_APPLICABLE.get(check, {})

    # ------------------------------------------------------------------ construction
    def cfg(self, tmp_path=None, name='a', **overrides):
        """The buffer's config; ``tmp_path`` (memmap and disk stores) with ``name`` keeps the files of several
        buffers of one test apart."""
        if self.chunk:
            # max_reuse=None: chunks leave by capacity only, so the item counts are those of the other types
            cfg = {
                'type': 'chunk',
                'max_chunks': self.cap,
                'fragments_per_chunk': FRAGMENTS_PER_CHUNK,
                'max_reuse': None,
                'seed': 0,
            }
            if self.storage == 'disk':
                cfg['store'] = {'type': 'disk', 'path': str(Path(tmp_path) / f'store_{name}')}
            else:
                cfg['store'] = {'type': 'memory'}
            cfg.update(overrides)
            return cfg
        cfg = {'type': self.preset, 'replay_buffer_size': self.cap, 'seed': 0}
        if self.storage == 'memmap':
            cfg['storage'] = {'type': 'tensor', 'memmap_dir': str(Path(tmp_path) / f'memmap_{name}')}
        elif self.storage is not None:
            cfg['storage'] = {'type': self.storage}
        if self.episodic and self.tensor:
            cfg['max_transitions'] = self.max_transitions
        if self.preset == 'prioritized_episode':
            cfg['sampler'] = {'unroll_len': self.unroll}
        if self.variant == 'prio':
            cfg.update(priority=True, priority_IS_weight=True, IS_weight_anneal_train_iter=20)
        cfg.update(overrides)
        return cfg

    def make(self, tmp_path=None, name='a', *args, **overrides):
        """A buffer; ``name`` keeps memmap directories / disk stores of several buffers of one test apart."""
        return create_buffer(self.cfg(tmp_path, name, **overrides), *args, instance_name='buffer')

    # ------------------------------------------------------------------ data
    def item(self, rng, i):
        """Item number ``i``: its obs is random, its ``act`` is ``i`` (traceable); every other one carries a
        priority where pushes take one."""
        item = {'obs': torch.from_numpy(rng.standard_normal(OBS_DIM).astype(np.float32)), 'act': i}
        if (self.preset == 'advanced' or self.variant == 'prio') and i % 2:
            item['priority'] = float(rng.uniform(0.1, 2.0))
        return item

    def episode(self, rng, e):
        """Episode number ``e``: length 2..5, a list of transitions (even e) or a dict of [T, ...] tensors."""
        length = int(rng.integers(2, 6))
        obs = torch.stack([torch.full((length,), float(e)), torch.arange(length, dtype=torch.float32)], dim=1)
        act = 100 * e + torch.arange(length)
        if e % 2 == 0:
            return [{'obs': obs[t].clone(), 'act': act[t].clone()} for t in range(length)]
        return {'obs': obs, 'act': act}

    def gfn_batch(self, rng, n):
        return {
            'state': torch.from_numpy(rng.standard_normal((n, GFN_DIM)).astype(np.float32)),
            'log_reward': torch.from_numpy(rng.standard_normal(n).astype(np.float32)),
        }

    def fragments(self, rng, c):
        """The fragments of chunk number ``c``: worker ``w{c // WORKER_SPAN}``, consecutive fids, payloads
        ``{'obs', 'act'}`` (``act`` is ``c``)."""
        worker, base = f'w{c // WORKER_SPAN}', (c % WORKER_SPAN) * FRAGMENTS_PER_CHUNK
        return [
            {
                'worker': worker,
                'fid': base + j,
                'model_version': 0,
                'data': {
                    'obs': torch.from_numpy(rng.standard_normal(OBS_DIM).astype(np.float32)),
                    'act': torch.tensor(c),
                },
            }
            for j in range(FRAGMENTS_PER_CHUNK)
        ]

    def data(self, rng, n, start=0):
        """What one push of ``n`` items takes: a list of items / episodes / fragments (``n`` chunks of them), or
        a dict batch (GFlowNet)."""
        if self.gfn:
            return self.gfn_batch(rng, n)
        if self.episodic:
            return [self.episode(rng, start + k) for k in range(n)]
        if self.chunk:
            return [f for k in range(n) for f in self.fragments(rng, start + k)]
        return [self.item(rng, start + k) for k in range(n)]

    def fill(self, buf, rng, n, start=0, log=None):
        """Push ``n`` items in chunks of at most 5; returns the next item number. ``log`` collects the size of
        every item pushed (episode lengths; 1 for items)."""
        done = 0
        while done < n:
            k = min(5, n - done)
            data = self.data(rng, k, start + done)
            if log is not None and self.episodic:
                log += [len(ep) if isinstance(ep, list) else len(ep['act']) for ep in data]
            elif log is not None:
                log += [1] * k
            buf.push(data)
            done += k
        return start + n

    def sample(self, buf, size, second=False):
        """A sample of ``size`` items (episodes / windows, sequence runs, chunks) through the type's own
        arguments; ``second`` picks the other form where there is one (episode windows, longer runs)."""
        if self.preset == 'episode' and second:
            return buf.sample(size, unroll_len=self.unroll)
        if self.preset == 'sequence':
            return buf.sample(size, 3 if second else 2)
        if self.preset == 'deque':
            return buf.sample(size, train_iter=2 if second else 1)
        if self.chunk:
            return buf.sample(size * FRAGMENTS_PER_CHUNK)
        return buf.sample(size)

    def exercise(self, buf, rng):
        """Fill past capacity (the ring wraps / items are evicted), sample, and update priorities."""
        nxt = self.fill(buf, rng, self.cap + 7)
        batch = self.sample(buf, 4)
        assert batch is not None
        if self.prioritized:
            buf.update(self.update_info(batch, rng.uniform(0.5, 3.0, size=4)))
        return nxt

    def stored_numbers(self, log):
        """Numbers of the items (episodes) a FIFO buffer keeps after pushes of these sizes (a reference)."""
        kept = []
        for number, size in enumerate(log):
            while kept and (
                len(kept) >= self.cap
                or (self.tensor and self.episodic and sum(n for _, n in kept) + size > self.max_transitions)
            ):
                kept.pop(0)
            kept.append((number, size))
        return {number for number, _ in kept}

    @staticmethod
    def numbers_of(batch):
        """The item number (``act``; the episode number for windows) of every sampled item / window."""
        if isinstance(batch, list):
            return [int(d['act']) for d in batch]
        act = batch['act']
        return (act[:, 0] // 100).tolist() if act.dim() == 2 else act.tolist()

    # ------------------------------------------------------------------ update
    def update_info(self, batch, priorities):
        """An ``update`` for a sampled batch (list of item dicts or dict of batched tensors): by id, or for the
        deque the priorities of its last sampled batch."""
        if self.updates_last_batch:
            return {'priority': list(map(float, priorities))}
        if isinstance(batch, list):
            ids = [d['replay_unique_id'] for d in batch]
            idx = [d['replay_buffer_idx'] for d in batch]
        else:
            ids, idx = batch['replay_unique_id'], batch['replay_buffer_idx']
        return {'replay_unique_id': ids, 'replay_buffer_idx': idx, 'priority': list(map(float, priorities))}

    def without_counters(self, state):
        """The state an update may not change: without the counters (and, for the deque, the remembered batch,
        which an update consumes)."""
        if self.updates_last_batch:
            return dict(without(state, 'last_batch'), inner=without(state['inner'], 'counters'))
        return without(state, 'counters')

    def garbage_updates(self, good):
        """``(label, info, exception)``: updates that must be refused as a whole, built from the well-formed
        ``good``. The bad entry is the last one, after valid entries, so a partial update would show."""
        prio = np.asarray(good['priority'], dtype=np.float64)

        def with_prio(value):
            bad = prio.astype(object)
            bad[-1] = value
            return dict(good, priority=bad.tolist())

        if self.updates_last_batch:  # inf is clipped at priority_max_limit by design: not garbage here
            return [
                ('nan priority', with_prio(NAN), ValueError),
                ('negative priority', with_prio(-0.5), ValueError),
                ('str priority', with_prio('x'), TypeError),
                ('priority list too short', {'priority': prio[:-1].tolist()}, ValueError),
                ('priority list too long', {'priority': prio.tolist() + [1.0]}, ValueError),
                ('not a dict', prio.tolist(), TypeError),
            ]
        ids = good['replay_unique_id']
        idx = np.asarray(torch.as_tensor(good['replay_buffer_idx']))
        last = (-1,) + (0,) * (idx.ndim - 1)  # the last item / the first step of the last window

        def with_idx(value):
            bad = idx.copy()
            bad[last] = value
            return dict(good, replay_buffer_idx=bad)

        return [
            ('nan priority', with_prio(NAN), ValueError),
            ('inf priority', with_prio(INF), ValueError),
            ('negative priority', with_prio(-0.5), ValueError),
            ('priority list too short', dict(good, priority=prio[:-1].tolist()), ValueError),
            ('replay_buffer_idx past the last slot', with_idx(self.slots), ValueError),
            ('negative replay_buffer_idx', with_idx(-7), ValueError),
            ('float replay_buffer_idx', dict(good, replay_buffer_idx=idx.astype(np.float64)), TypeError),
            ('no replay_buffer_idx', {'replay_unique_id': ids, 'priority': prio.tolist()}, ValueError),
            ('no replay_unique_id', {'replay_buffer_idx': idx, 'priority': prio.tolist()}, ValueError),
            ('not a dict', prio.tolist(), TypeError),
        ]

    # ------------------------------------------------------------------ invalid pushes
    def invalid_pushes(self, rng):
        """``(label, args, kwargs, exceptions)`` of pushes that must be refused as a whole. Each batch holds
        valid items before the invalid one, so a partial write would show in the state."""
        ok = self.data(rng, 2, start=1000)
        if self.gfn:
            return self._invalid_gfn_pushes(rng)
        if self.chunk:
            return self._invalid_fragments(ok)
        out = [('None item', (ok + [None],), {}, TypeError)]
        if self.episodic:
            return out + self._invalid_episodes(ok)
        cap, dim = self.cap, OBS_DIM
        batched = self.preset != 'deque'  # the deque's push has no batched argument
        if self.preset == 'advanced' or self.variant == 'prio':
            valid = {'obs': torch.zeros(dim), 'act': 3}
            out += [
                ('item that is not a dict', (ok + [5],), {}, TypeError),
                ('nan priority', (ok + [{**valid, 'priority': NAN}],), {}, ValueError),
                ('negative priority', (ok + [{**valid, 'priority': -1.0}],), {}, ValueError),
                ('inf priority', (ok + [{**valid, 'priority': INF}],), {}, ValueError),
                ('single item with nan priority', ({**valid, 'priority': NAN},), {}, ValueError),
            ]
            if batched:
                nan_batch = {'obs': torch.zeros(3, dim), 'act': torch.arange(3), 'priority': torch.tensor([1, 1, NAN])}
                out.append(('batched push with a nan priority', (nan_batch,), {'batched': True}, ValueError))
        if batched:
            ragged = {'obs': torch.zeros(3, dim), 'act': torch.arange(2)}
            out.append(('batched push with ragged fields', (ragged,), {'batched': True}, ValueError))
        if self.tensor:
            out += [
                ('item with a wrong obs shape', (ok + [{'obs': torch.zeros(dim + 1), 'act': 1}],), {}, ValueError),
                ('single item with a wrong obs shape', ({'obs': torch.zeros(dim + 1), 'act': 1},), {}, ValueError),
                (
                    'item with a wrong dtype',
                    (ok + [{'obs': torch.zeros(dim, dtype=torch.float64), 'act': 1}],),
                    {},
                    ValueError,
                ),
                ('item with a missing field', (ok + [{'obs': torch.zeros(dim)}],), {}, ValueError),
                ('item with an extra field', (ok + [{'obs': torch.zeros(dim), 'act': 1, 'x': 2}],), {}, ValueError),
                ('item that is not a dict', (ok + [7],), {}, TypeError),
                (
                    'invalid item among those dropped for space',
                    ([{'obs': torch.zeros(dim + 1), 'act': 1}] + self.data(rng, cap + 2, start=3000),),
                    {},
                    ValueError,
                ),
            ]
        return out

    def _invalid_gfn_pushes(self, rng):
        def batch(**fields):
            b = self.gfn_batch(rng, 4)
            b.update(fields)
            return b

        r_nan = torch.tensor([0.0, 1.0, -1.0, NAN])
        r_inf = torch.tensor([0.0, 1.0, -1.0, INF])
        items = [{'state': torch.zeros(GFN_DIM), 'log_reward': torch.tensor(0.5)} for _ in range(3)]
        out = [
            ('nan log_reward', (batch(log_reward=r_nan),), {}, ValueError),
            ('+inf log_reward', (batch(log_reward=r_inf),), {}, ValueError),
            ('2-d log_reward', (batch(log_reward=torch.zeros(4, 1)),), {}, ValueError),
            ('integer log_reward', (batch(log_reward=torch.zeros(4, dtype=torch.int64)),), {}, ValueError),
            ('ragged batch', (batch(state=torch.zeros(3, GFN_DIM)),), {}, ValueError),
            ('no log_reward', ({'state': torch.zeros(4, GFN_DIM)},), {}, ValueError),
            (
                'item with wrong state dim',
                (items + [{'state': torch.zeros(GFN_DIM + 1), 'log_reward': torch.tensor(0.5)}],),
                {},
                ValueError,
            ),
            ('None item', (items + [None],), {}, TypeError),
            ('None', (None,), {}, TypeError),
            ('not a dict', (5,), {}, TypeError),
        ]
        if self.preset == 'gfn_diverse':
            state = torch.zeros(4, GFN_DIM)
            state[3, 0] = NAN
            out.append(('nan state', (batch(state=state),), {}, ValueError))
        return out

    def _invalid_episodes(self, ok):
        out = [
            ('empty episode', (ok + [[]],), {}, ValueError),
            ('episode of the wrong type', (ok + [5],), {}, TypeError),
            (
                'dict episode with ragged fields',
                (ok + [{'obs': torch.zeros(3, 2), 'act': torch.zeros(2)}],),
                {},
                ValueError,
            ),
            ('batched push', (ok[1],), {'batched': True}, TypeError),
        ]
        if self.tensor:
            step = {'obs': torch.zeros(2), 'act': torch.tensor(1)}
            bad_shape = [step, {'obs': torch.zeros(3), 'act': torch.tensor(2)}]
            bad_dtype = [step, {'obs': torch.zeros(2), 'act': torch.tensor(1.5)}]
            out += [
                ('transition with a wrong obs shape', (ok + [bad_shape],), {}, ValueError),
                ('transition with a wrong dtype', (ok + [bad_dtype],), {}, ValueError),
                (
                    'episode longer than max_transitions',
                    (ok + [[step] * (self.max_transitions + 1)],),
                    {},
                    ValueError,
                ),
            ]
        return out

    def _invalid_fragments(self, ok):
        """The chunk buffer's fragments: ``ok`` are worker w0's complete chunks; a bad fragment follows them."""

        def frag(**kw):
            f = {'worker': 'w9', 'fid': 0, 'model_version': 0, 'data': {'obs': torch.zeros(OBS_DIM)}}
            f.update(kw)
            return {k: v for k, v in f.items() if v is not ...}

        last = ok[-1]['fid']
        out = [
            ('None item', (ok + [None],), {}, TypeError),
            ('fragment that is not a dict', (ok + [5],), {}, TypeError),
            ('single fragment that is not a dict', (5,), {}, TypeError),
            ('fragment with neither data nor fragment_id', (ok + [frag(data=...)],), {}, ValueError),
            ('fragment with both data and fragment_id', (ok + [frag(fragment_id='a' * 32)],), {}, ValueError),
            ('fragment with an empty worker', (ok + [frag(worker='')],), {}, ValueError),
            ('fragment with a float fid', (ok + [frag(fid=1.0)],), {}, ValueError),
            ('fragment with a bool model_version', (ok + [frag(model_version=True)],), {}, ValueError),
            ('fragment with a session_id that is not a str', (ok + [frag(session_id=5)],), {}, ValueError),
            ('fragment with an unknown key', (ok + [frag(priority=3)],), {}, ValueError),
            ('fragment_id not in the store', (ok + [frag(data=..., fragment_id='b' * 32)],), {}, ValueError),
            ('fragment of its worker repeated', (ok + [frag(worker='w0', fid=last)],), {}, ValueError),
            ('gap inside a chunk', (ok + [frag(fid=0), frag(fid=2)],), {}, ValueError),
            ('batched push', (ok[0],), {'batched': True}, ValueError),
        ]
        if self.storage == 'disk':
            out.append(('payload that a disk store cannot keep', (ok + [frag(data=object())],), {}, TypeError))
        return out
