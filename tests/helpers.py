"""Code shared by the test modules of every folder (tests/conftest.py puts this folder on ``sys.path``): exact
state comparison, chi-square, references for the sampling and distance parts (a numpy Generator that refuses
population-sized work, the brute-force p-norm distance), waiting with a deadline, the thread-stress runner, MPI
availability, the environment of test subprocesses, the state-corruption tools of the property suites, and
``Case``: one buffer type x storage combination, as the contract suite (tests/buffers/test_contract.py) and the
property suites (tests/test_properties.py, tests/buffers/test_dingengine_properties.py) configure, feed and probe
it."""

import collections
import copy
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
def wait_until(predicate, timeout=30.0):
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


def ray_init_local(*first, num_cpus: int = 2) -> None:
    """``ray.init`` of a local cluster whose processes import from ``first``, the shared helpers and this checkout
    (they inherit the raylet's environment, cheaper than a runtime_env per worker); the driver's own PYTHONPATH is
    restored afterwards."""
    import ray

    old = os.environ.get('PYTHONPATH')
    os.environ['PYTHONPATH'] = pythonpath(*first)
    try:
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    finally:
        if old is None:
            os.environ.pop('PYTHONPATH', None)
        else:
            os.environ['PYTHONPATH'] = old


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


# ================================================================================ corrupted states
class Payload:
    """An arbitrary Python object (not a tensor / container): list storage must pickle it to save it."""

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return isinstance(other, Payload) and other.value == self.value


# state entry -> values it must never take (wherever the entry appears in a state)
BAD_STATE_VALUES = {
    'current_buffer_size': [0, -1],  # elastic
    'last_log_train_iter': [2**70, -(2**60), 1.5],  # deque (sample's train_iter is within +-2**60)
    'last_batch': [  # deque: None or ids and slots of equal length, slots in range
        {'ids': ['buffer_0'], 'slots': [99]},
        {'ids': ['a', 'b'], 'slots': [1]},
        [1, 2],
        {'ids': [1.5], 'slots': [0]},
    ],
    'beta': [2.0, -0.5],  # advanced
    'max_priority': [1e300],  # prioritized_episode's windows: beyond float32, new windows would sample with inf
}


def _holds_tensors(value):
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, dict):
        return any(_holds_tensors(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_tensors(v) for v in value)
    return False


def _sections(state, path=()):
    """``(path, dict)`` of every dict in ``state`` (depth first, the state itself first)."""
    if isinstance(state, dict):
        yield path, state
        for k, v in state.items():
            yield from _sections(v, path + (k,))


def _changed(state, path, change):
    """A deep copy of ``state`` where ``change`` was applied to the dict at ``path``."""
    out = copy.deepcopy(state)
    node = out
    for k in path:
        node = node[k]
    change(node)
    return out


def _ring_tampers(ring):
    """``(label, change)`` of a slot ring's state (``capacity``, ``head``, ``span``, ``uid``, ``valid``, ...)."""
    cap, count = int(ring['capacity']), int(torch.as_tensor(ring['valid']).sum())

    def setter(key, value):
        return lambda r: r.__setitem__(key, value)

    def uid_out_of_range(r):
        r['uid'][r['valid']] = r['next_uid'] + 1

    return [
        ('capacity + 1', setter('capacity', cap + 1)),
        ('head out of range', setter('head', cap + 84)),
        ('span beyond the capacity', setter('span', cap + 1)),
        ('span below the count', setter('span', max(count - 1, 0))),
        ('uid at or past next_uid', uid_out_of_range),
        ('valid of another length', lambda r: r.__setitem__('valid', r['valid'][: cap // 2])),
        ('no next_uid', lambda r: r.pop('next_uid')),
        ('head moved by one', setter('head', (int(ring['head']) + 1) % cap)),
        ('next_uid past 2**62', setter('next_uid', 2**63)),  # every later push's id would overflow
        ('push_count past 2**62', setter('push_count', 2**63)),
    ]


def _storage_tampers(st):
    """``(label, change)`` of a storage section (``kind``, ``ring``, ``slots``, ``items`` / ``fields``)."""

    def shorter_data(x):
        if 'items' in x:
            x['items'] = x['items'][:-1]
        else:
            x['fields'] = [t[:-1] for t in x['fields']]

    out = [
        ('kind of the other storage', lambda x: x.__setitem__('kind', 'tensor' if x['kind'] == 'list' else 'list')),
        ('slots one short', lambda x: x.__setitem__('slots', x['slots'][:-1])),
        ('data one short', shorter_data),
        ('ring is None', lambda x: x.__setitem__('ring', None)),
    ]
    if 'frames' in st and len(st['slots']) > 1:  # frame streams follow the ring's order (a push then asserted)
        out.append(('slots in reverse order', lambda x: x.__setitem__('slots', torch.as_tensor(x['slots']).flip(0))))
    return out


def _index_tampers(state):
    """``(label, change)`` of a prioritized index (``priority`` / ``leaves`` / ``use`` per slot) next to a ring."""
    valid = torch.as_tensor(state['storage']['ring']['valid'])
    live, holes = np.flatnonzero(valid.numpy()), np.flatnonzero(~valid.numpy())

    def at(key, slot, value):
        return lambda s: s['index'][key].__setitem__(int(slot), value)

    out = [
        ('negative priority of a stored item', at('priority', live[0], -1.0)),
        ('nan priority of a stored item', at('priority', live[0], NAN)),
        ('negative leaf of a stored item', at('leaves', live[0], -0.5)),
        ('nan leaf of a stored item', at('leaves', live[0], NAN)),
        ('leaves one short', lambda s: s['index'].__setitem__('leaves', s['index']['leaves'][:-1])),
        (
            'priority one long',
            lambda s: s['index'].__setitem__('priority', torch.cat([s['index']['priority'], torch.zeros(1)])),
        ),
        ('use of 3 slots', lambda s: s['index'].__setitem__('use', s['index']['use'][:3])),
        ('negative use', at('use', 0, -1)),
        ('nan max_priority', lambda s: s['index'].__setitem__('max_priority', NAN)),
        ('max_priority beyond float32', lambda s: s['index'].__setitem__('max_priority', 1e300)),
        ('leaf beyond float32', at('leaves', live[0], 1e300)),  # its priority would be inf
    ]
    if len(holes):
        out.append(('leaf at an empty slot', at('leaves', holes[0], 0.5)))
    return out


# types whose state must carry its counters (the others load a state without them with zeros)
COUNTERS_REQUIRED = ('AdvancedReplayBuffer', 'ChunkReplayBuffer')


def _counter_tampers(state):
    """``(label, corrupted state)`` of a state's ``counters``: one missing, one negative (each of them)."""
    counters = state['counters']
    out = [('no counters', without(state, 'counters'))] if state.get('type') in COUNTERS_REQUIRED else []
    for key in counters:
        out.append((f'no counters.{key}', dict(state, counters=without(counters, key))))
        out.append((f'negative counters.{key}', dict(state, counters=dict(counters, **{key: -1}))))
    return out


# entries a state of an earlier version lacks, which it loads without (list storage: each item's collect_iter as
# stored, read from the items themselves then)
OLDER_STATES_LACK = {('storage', 'collect_iter')}


def state_corruptions(state):
    """``(label, corrupted state)``: states ``load_state_dict`` must refuse. A state that is not a dict, of another
    buffer type, without a type, with a broken RNG; every top-level entry of a wrong type (a str; an int for a str
    entry); the RNG and every entry holding data (tensors) missing; every entry of the storage / store / index
    sections and every payload (chunk buffer) missing; a slot ring's, a storage section's and a prioritized
    index's entries out of line with each other (wherever they appear); a counter missing or negative, and no
    counters at all where the type requires them (``COUNTERS_REQUIRED``: the others load a state saved before
    they had counters with zeros); a negative thruput count; the values of ``BAD_STATE_VALUES``; and all of these
    in the state of the buffer a wrapper holds (the deque's ``inner``)."""
    out = [
        ('not a dict', [state]),
        ('wrong type', dict(state, type='SomeOtherBuffer')),
        ('no type', without(state, 'type')),
    ]
    if 'rng' in state:
        out.append(('rng of an unknown bit generator', dict(state, rng={'bit_generator': 'NoSuch', 'state': {}})))
    for key in state:
        if key == 'type' or key == 'track_states':  # GFlowNet: see test_load_state_dict_inconsistent_gfn_state
            continue
        if key == 'rng' or _holds_tensors(state[key]):
            out.append((f'no {key!r}', without(state, key)))
        if isinstance(state[key], str):  # (the chunk buffer's session_id): a str of another type
            out.append((f'{key!r} is an int', dict(state, **{key: 5})))
        else:
            out.append((f'{key!r} is a str', dict(state, **{key: 'garbage'})))
    if isinstance(state.get('counters'), dict):
        out += _counter_tampers(state)
    if isinstance(state.get('thruput'), dict) and 'push' in state['thruput']:
        out.append(('negative thruput.push', dict(state, thruput=dict(state['thruput'], push=-1.0))))
    for section in ('storage', 'episodes', 'store', 'index', 'payloads'):
        sub = state.get(section)
        if isinstance(sub, dict):
            for key in sub:
                if (section, key) in OLDER_STATES_LACK:
                    continue
                out.append((f'no {section}.{key}', dict(state, **{section: without(sub, key)})))
    for path, sub in _sections(state):
        if path[:1] == ('inner',):
            continue  # (below)
        where = '.'.join(map(str, path)) or 'state'
        if isinstance(sub.get('ring'), dict):
            out += [
                (f'{where}.ring: {label}', _changed(state, path + ('ring',), f))
                for label, f in _ring_tampers(sub['ring'])
            ]
        if {'kind', 'ring', 'slots'} <= set(sub):
            out += [(f'{where}: {label}', _changed(state, path, f)) for label, f in _storage_tampers(sub)]
        if (
            isinstance(sub.get('index'), dict)
            and {'priority', 'leaves', 'use'} <= set(sub['index'])
            and 'storage' in sub
        ):
            out += [(f'{where}.index: {label}', _changed(state, path, f)) for label, f in _index_tampers(sub)]
        for key, values in BAD_STATE_VALUES.items():
            if key in sub:
                out += [
                    (f'{where}.{key} = {v!r}', _changed(state, path, lambda x, k=key, v=v: x.__setitem__(k, v)))
                    for v in values
                ]
    out += _episode_tampers(state)
    if isinstance(state.get('inner'), dict):
        out += [(f'inner: {label}', dict(state, inner=bad)) for label, bad in state_corruptions(state['inner'])]
    return out


def _episode_tampers(state):
    """``(label, corrupted state)`` of an episode table's lengths and (tensor storage) starts: a length past any
    capacity (it was allocated for before it was checked), a start one ring further (the same slot modulo the
    ring, out of range)."""
    eps = state.get('episodes')
    if not isinstance(eps, dict) or 'length' not in eps or not int(torch.as_tensor(eps['length']).count_nonzero()):
        return []
    slot = int(torch.as_tensor(eps['length']).nonzero()[0, 0])
    out = [
        ('an episode length of 2**40', _changed(state, ('episodes',), lambda x: x['length'].__setitem__(slot, 2**40)))
    ]
    if 'start' in eps:
        cap = int(eps['storage']['ring']['capacity'])
        out.append(
            (
                'an episode start one ring further',
                _changed(state, ('episodes',), lambda x: x['start'].__setitem__(slot, int(x['start'][slot]) + cap)),
            )
        )
    return out


# ================================================================================ the Case model
OBS_DIM = 4  # obs of the items the Case pushes
GFN_DIM = 3  # state dimension of the GFlowNet items
FRAGMENTS_PER_CHUNK = 2  # the chunk buffer's fragments_per_chunk: a pushed "item" is one chunk of fragments
WORKER_SPAN = 10**6  # chunk buffer: item numbers [k * WORKER_SPAN, (k + 1) * WORKER_SPAN) come from worker k
GFN_PRESETS = ('gfn', 'gfn_diverse', 'terminating_state')
EPISODIC_PRESETS = ('episode', 'prioritized_episode')


# envstep -> what the elastic buffer's set_buffer_size answers there (anything else: 1000 + envstep % 7, a window
# wider than the ring); 1010 raises
ELASTIC_BAD_SIZES = {1001: 0, 1002: -3, 1003: 2.5, 1004: NAN, 1005: INF, 1006: 'x', 1007: None, 1008: True}


def elastic_schedule(envstep):
    """The ``set_buffer_size`` of the Case's elastic buffers: a window wider than the ring, except at the envsteps
    of ``ELASTIC_BAD_SIZES`` (a size that is not one) and 1010 (raises ``ZeroDivisionError``)."""
    if envstep == 1010:
        return 10 // (envstep - 1010)
    return ELASTIC_BAD_SIZES.get(envstep, 1000 + envstep % 7)


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
        'another configuration': {
            p: 'a GFlowNet state carries its settings (capacity included): a load adopts them' for p in GFN_PRESETS
        },
        'helper threads': {
            'deque': 'the deque wrapper starts no thread (its TensorBoard writes happen inside sample)',
            'chunk': 'the chunk buffer starts no thread (no monitors, no used-data remover)',
        },
    }

    def __init__(self, preset, storage=None, variant=None, cap=16, max_transitions=40, unroll=2, limit_list=False):
        self.preset = preset
        self.limit_list = limit_list  # episode buffers on list storage: also configure max_transitions
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
    def limits_transitions(self):
        """An episode buffer configured with ``max_transitions`` (always on tensor storage; on list storage with
        ``limit_list``)."""
        return self.episodic and (self.tensor or self.limit_list)

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

    def why_not(self, check):
        """Why ``check`` does not apply to this combination ('' when it does)."""
        if check == 'python objects' and self.storage not in ('list', 'memory'):
            if self.chunk:
                return 'a disk store keeps plain data only (it refuses other payloads at push)'
            return 'only list storage keeps arbitrary Python objects (the others keep tensors)'
        return self.NOT_APPLICABLE.get(check, {}).get(self.preset, '')

    def require(self, check):
        """Skip the calling test where ``check`` does not apply to this combination, with the reason."""
        why = self.why_not(check)
        if why:
            pytest.skip(f'{self.id}: {check} does not apply: {why}')

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
        if self.limits_transitions:
            cfg['max_transitions'] = self.max_transitions
        if self.preset == 'elastic':
            cfg['set_buffer_size'] = elastic_schedule
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
                or (self.limits_transitions and sum(n for _, n in kept) + size > self.max_transitions)
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

    @property
    def takes_garbage_updates(self):
        """``update`` can be refused: the prioritized types, and the elastic buffer's ``update(envstep)``."""
        return self.prioritized or self.preset == 'elastic'

    def good_update(self, batch):
        """A well-formed update for the sampled ``batch`` and what ``update`` answers to it."""
        if self.preset == 'elastic':
            return 50, None  # the window becomes set_buffer_size(50) = 1001
        n = len(batch) if isinstance(batch, list) else len(next(iter(batch.values())))
        return self.update_info(batch, [2.5] * n), {'updated': n, 'stale': 0}

    def garbage_updates(self, good):
        """``(label, info, exception[, message regex])``: updates that must be refused as a whole, built from the
        well-formed ``good``. The bad entry is the last one, after valid entries, so a partial update would
        show."""
        if self.preset == 'elastic':  # update(envstep) asks set_buffer_size (elastic_schedule) for the window
            out = [
                (f'set_buffer_size answers {size!r}', envstep, ValueError, rf'set_buffer_size\({envstep}\)')
                for envstep, size in ELASTIC_BAD_SIZES.items()
            ]
            return out + [
                ('set_buffer_size raises', 1010, ValueError, 'raised at envstep 1010: ZeroDivisionError'),
                ('envstep beyond 2**60', 10**30, ValueError, 'envstep'),
                ('envstep that is a float', 1.5, TypeError),
                ('envstep that is a bool', True, TypeError),
            ]
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
                ('priority that is a str', {'priority': 'x'}, TypeError),
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

        objects = np.empty(idx.shape, dtype=object)  # (ids are shaped like the slots)
        objects.flat[:] = [object() for _ in range(objects.size)]
        out = [
            ('nan priority', with_prio(NAN), ValueError),
            ('inf priority', with_prio(INF), ValueError),
            ('negative priority', with_prio(-0.5), ValueError),
            ('priority list too short', dict(good, priority=prio[:-1].tolist()), ValueError),
            ('replay_buffer_idx past the last slot', with_idx(self.slots), ValueError),
            ('negative replay_buffer_idx', with_idx(-7), ValueError),
            ('huge replay_buffer_idx', with_idx(10**6), ValueError),
            ('replay_buffer_idx list too short', dict(good, replay_buffer_idx=idx[:-1]), ValueError),
            ('float replay_buffer_idx', dict(good, replay_buffer_idx=idx.astype(np.float64)), TypeError),
            ('no replay_buffer_idx', {'replay_unique_id': ids, 'priority': prio.tolist()}, ValueError),
            ('no replay_unique_id', {'replay_buffer_idx': idx, 'priority': prio.tolist()}, ValueError),
            ('replay_unique_id of objects', dict(good, replay_unique_id=objects.tolist()), TypeError),
            ('not a dict', prio.tolist(), TypeError),
            ('a list of the update', [good], TypeError),
        ]
        if isinstance(good['replay_buffer_idx'], torch.Tensor):  # a tensor sample: the compiled fast path
            tidx = good['replay_buffer_idx']
            for label, value in (('nan', NAN), ('negative', -1.0), ('inf', INF)):
                t = torch.ones(tuple(tidx.shape[:1]), dtype=torch.float64)
                t[-1] = value
                out.append((f'{label} priority (tensors)', dict(good, priority=t), ValueError, 'priority'))
            out.append(
                (
                    'replay_buffer_idx past the last slot (tensors)',
                    dict(good, replay_buffer_idx=tidx + self.slots, priority=torch.ones(tuple(tidx.shape[:1]))),
                    ValueError,
                    'replay_buffer_idx',
                )
            )
        if self.preset == 'prioritized_episode':  # one priority per step of each window
            for label, value in (('nan', NAN), ('negative', -1.0)):
                steps = torch.ones(tuple(idx.shape), dtype=torch.float64)
                steps.view(-1)[3] = value
                out.append((f'{label} step priority', dict(good, priority=steps), ValueError))
        return out

    # ------------------------------------------------------------------ states and files that must be refused
    def corruptions(self, state):
        """``(label, corrupted state)`` of a state (a ``state_dict()`` of this type) that ``load_state_dict`` must
        refuse: see ``state_corruptions``."""
        return state_corruptions(state)

    def other_configs(self):
        """``(label, config overrides)``: buffers of this type configured otherwise, whose states this one must
        refuse (capacity, storage kind, transition limit)."""
        if self.chunk:
            return [('max_chunks x 2', {'max_chunks': 2 * self.cap})]
        out = [('replay_buffer_size x 2', {'replay_buffer_size': 2 * self.cap})]
        if self.storage in ('list', 'tensor', 'memmap') and self.preset != 'prioritized_episode':
            other = 'list' if self.tensor else 'tensor'
            over = {'storage': {'type': other}}
            if self.episodic:
                over['max_transitions'] = self.max_transitions  # (tensor storage needs it)
            out.append((f'{other} storage', over))
        if self.limits_transitions:
            out.append(('max_transitions + 1', {'max_transitions': self.max_transitions + 1}))
            out.append(('max_transitions x 2', {'max_transitions': 2 * self.max_transitions}))
        return out

    def object_data(self, rng, obj):
        """A push whose first item (episode: its first list of steps) holds ``obj`` -- a Python object, a numpy
        array: on list storage (and in the chunk buffer's memory store) its file needs ``allow_pickle``."""
        data = self.data(rng, 3)
        if self.chunk:
            data[0] = dict(data[0], data=obj)
        elif self.episodic:  # episodes 0 and 2 are lists of steps
            data[0] = [dict(t, payload=obj) for t in data[0]]
        else:
            data[0] = dict(data[0], payload=obj)
        return data

    # ------------------------------------------------------------------ invalid pushes
    def invalid_pushes(self, rng):
        """``(label, args, kwargs, exceptions)`` of pushes that must be refused as a whole. Each batch holds
        valid items before the invalid one, so a partial write would show in the state."""
        ok = self.data(rng, 2, start=1000)
        if self.gfn:
            return self._invalid_gfn_pushes(rng)
        if self.chunk:
            return self._invalid_fragments(ok)
        out = [('None item', (ok + [None],), {}, TypeError), ('None', (None,), {}, TypeError)]
        if self.episodic:
            return out + self._invalid_episodes(ok)
        cap, dim = self.cap, OBS_DIM
        batched = self.preset != 'deque'  # the deque's push has no batched argument
        if self.preset == 'advanced' or self.variant == 'prio':
            valid = {'obs': torch.zeros(dim), 'act': 3}
            out += [
                ('item that is not a dict', (ok + [5],), {}, TypeError),
                ('item that is a str', (ok + ['not a dict'],), {}, TypeError),
                ('item that is a list', (ok + [[1, 2]],), {}, TypeError),
                ('nan priority', (ok + [{**valid, 'priority': NAN}],), {}, ValueError),
                ('negative priority', (ok + [{**valid, 'priority': -1.0}],), {}, ValueError),
                ('inf priority', (ok + [{**valid, 'priority': INF}],), {}, ValueError),
                (
                    'priority that is not a scalar',
                    (ok + [{**valid, 'priority': np.array([1.0, 2.0])}],),
                    {},
                    ValueError,
                ),
                ('str priority', (ok + [{**valid, 'priority': 'high'}],), {}, TypeError),
                ('single item that is a str', ('not a dict',), {}, TypeError),
                ('single item that is an int', (5,), {}, TypeError),
            ]
            singles = [('nan', NAN), ('negative', -1.0), ('inf', INF), ('non-scalar', np.array([1.0, 2.0]))]
            out += [
                (f'single item with a {what} priority', ({**valid, 'priority': p},), {}, ValueError)
                for what, p in singles
            ]
            out.append(('single item with a str priority', ({**valid, 'priority': 'high'},), {}, TypeError))
            if batched:
                batches = [
                    ('a nan priority', [1, 1, NAN]),
                    ('a negative priority', [1, -2, 1]),
                    ('2 priorities', [1, 2]),
                ]
                out += [
                    (f'batched push with {what}', (self._batch(priority),), {'batched': True}, ValueError)
                    for what, priority in batches
                ]
        if batched:
            ragged = {'obs': torch.zeros(3, dim), 'act': torch.arange(2)}
            out += [
                ('batched push with ragged fields', (ragged,), {'batched': True}, ValueError),
                ('batched push of a list', (ok,), {'batched': True}, TypeError),
            ]
            out += self._invalid_tensordicts(ok)
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
                (
                    'item with a str where the schema has a number',
                    (ok + [{'obs': torch.zeros(dim), 'act': 'not a number'}],),
                    {},
                    TypeError,
                ),
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

    @staticmethod
    def _batch(priority):
        """A batched push of three items with these priorities."""
        return {'obs': torch.zeros(3, OBS_DIM), 'act': torch.arange(3), 'priority': torch.tensor(priority)}

    def _invalid_tensordicts(self, ok):
        """TensorDicts whose batch_size contradicts how they are pushed (where tensordict is installed)."""
        try:
            from tensordict import TensorDict
        except ImportError:
            return []
        one = TensorDict({'obs': torch.zeros(OBS_DIM), 'act': torch.tensor(1)}, batch_size=[])
        two = TensorDict({'obs': torch.zeros(2, OBS_DIM), 'act': torch.arange(2)}, batch_size=[2])
        out = [
            ('TensorDict of batch_size [] pushed with batched=True', (one,), {'batched': True}, ValueError, r'\[\]'),
        ]
        if self.tensor:  # (list storage keeps any object, a TensorDict too)
            batch_in_list = ('TensorDict batch inside a list of items', (ok + [two],), {}, ValueError)
            out.append(batch_in_list + (r'is a TensorDict with batch_size \[2\]',))
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
            ('empty dict episode', (ok + [{}],), {}, (TypeError, ValueError)),
            ('episode of the wrong type', (ok + [5],), {}, TypeError),
            (
                'dict episode with ragged fields',
                (ok + [{'obs': torch.zeros(3, 2), 'act': torch.zeros(2)}],),
                {},
                ValueError,
            ),
            ('batched push', (ok[1],), {'batched': True}, TypeError),
        ]
        step = {'obs': torch.zeros(2), 'act': torch.tensor(1)}
        if self.limits_transitions:
            n = self.max_transitions + 1
            too_long = {'obs': torch.zeros(n, 2), 'act': torch.arange(n)}
            out.append(('episode longer than max_transitions', (ok + [[step] * n],), {}, ValueError))
            out.append(('dict episode longer than max_transitions', (ok + [too_long],), {}, ValueError))
        if self.tensor:
            bad_shape = [step, {'obs': torch.zeros(3), 'act': torch.tensor(2)}]
            bad_dtype = [step, {'obs': torch.zeros(2), 'act': torch.tensor(1.5)}]
            act = torch.arange(2)
            out += [
                ('transition with a wrong obs shape', (ok + [bad_shape],), {}, ValueError),
                ('transition with a wrong dtype', (ok + [bad_dtype],), {}, ValueError),
                ('transition that is not a dict', (ok + [[step, 3]],), {}, (TypeError, ValueError)),
                ('dict episode with a wider obs', (ok + [{'obs': torch.zeros(2, 3), 'act': act}],), {}, ValueError),
                (
                    'dict episode with a float64 obs',
                    (ok + [{'obs': torch.zeros(2, 2, dtype=torch.float64), 'act': act}],),
                    {},
                    ValueError,
                ),
                ('dict episode with a missing field', (ok + [{'obs': torch.zeros(2, 2)}],), {}, ValueError),
                (
                    'dict episode with an extra field',
                    (ok + [{'obs': torch.zeros(2, 2), 'act': act, 'rew': torch.zeros(2)}],),
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


# ================================================================================ n-step returns
def n_step_reference(steps, n, gamma):
    """Per step id: (return, next_obs, done, truncated, k) over up to n steps of its environment's episode, every
    pushed step counted (what a buffer that keeps every successor -- FIFO, no frame expiry -- returns)."""
    by_env = {}
    for t in steps:
        by_env.setdefault(t['env_id'], []).append(t)
    ref = {}
    for seq in by_env.values():
        for i, t in enumerate(seq):
            ret, k, last = 0.0, 0, t
            for j in range(n):
                if i + j >= len(seq):
                    break
                cur = seq[i + j]
                ret += gamma**j * cur['reward']
                k, last = k + 1, cur
                if cur['done'] or cur['truncated']:
                    break
            ref[t['step']] = (ret, last['next_obs'], last['done'], last['truncated'], k)
    return ref


class FrameEnvs:
    """Synthetic vectorised environments: random uint8 frames, a frame stack of ``stack`` padded by repeating
    the reset frame (gymnasium's FrameStackObservation), episodes of random length ending by termination or
    truncation. ``steps(n)`` yields transitions env by env, round robin, each with a unique ``step``."""

    def __init__(self, n_envs=3, stack=4, seed=0, max_len=9, side=5):
        self.rng = np.random.default_rng(seed)
        self.side = side
        self.stack, self.max_len, self.n = stack, max_len, n_envs
        self.hist = [None] * n_envs
        self.left = [0] * n_envs
        self.count = 0

    def _frame(self):
        return self.rng.integers(0, 256, (self.side, self.side), dtype=np.uint8)

    def _obs(self, e):
        return np.stack(self.hist[e][-self.stack :])

    def step(self, e):
        if self.hist[e] is None:
            first = self._frame()
            self.hist[e] = [first] * self.stack
            self.left[e] = int(self.rng.integers(1, self.max_len + 1))
        obs = self._obs(e)
        self.hist[e].append(self._frame())
        nxt = self._obs(e)
        self.left[e] -= 1
        end = self.left[e] == 0
        trunc = bool(end and self.rng.random() < 0.5)
        t = dict(
            obs=obs,
            next_obs=nxt,
            action=int(self.rng.integers(6)),
            reward=float(self.rng.normal()),
            done=bool(end and not trunc),
            truncated=trunc,
            env_id=e,
            step=self.count,
        )
        self.count += 1
        if end:
            self.hist[e] = None
        return t

    def steps(self, n):
        return [self.step(k % self.n) for k in range(n)]


class FakeTB:
    """A stand-in for a ``SummaryWriter`` (what DI-engine's pipelines pass as ``tb_logger``): collects
    ``add_scalar`` calls as ``(tag, value, step)`` rows."""

    all_writers = {}  # (torch's marker of an open writer)

    def __init__(self):
        self.rows = []

    def add_scalar(self, tag, value, step):
        self.rows.append((tag, value, step))

    def flush(self):
        pass

    def tags(self):
        return collections.Counter(tag for tag, _, _ in self.rows)


def answer_while_held(lock, call):
    """What ``call()`` answers (its result, or the exception it raised) in another thread while this one holds
    ``lock`` throughout -- until it answered, or 30 s (a hang guard); ``[]`` when it had not answered by then."""
    out = []

    def ask():
        try:
            out.append(call())
        except Exception as e:  # noqa: BLE001 - the answer under test
            out.append(e)

    with lock:
        t = threading.Thread(target=ask)
        t.start()
        t.join(30)
        answered = list(out)
    t.join(30)
    return answered
