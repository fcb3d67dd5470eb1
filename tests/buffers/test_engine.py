"""The shape of the buffers: one concrete engine, presets as data, ``chunk`` and ``deque`` on the engine.

Every registered type sits directly on ``Engine`` (two levels below ``IBuffer``); a preset's own methods only hand
a call to its table; ``isinstance`` still follows DI-engine's and torchgfn's class nesting; the parts of the engine
(limiter waits, counters, the state envelope) serve ``chunk`` and ``deque`` as they serve every other type.
"""

import ast
import copy
import inspect
import os
import sys
import textwrap
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import answer_while_held, assert_same

from ding_buffer import BUFFER_REGISTRY, create_buffer
from ding_buffer.base import IBuffer
from ding_buffer.buffers import (
    AdvancedReplayBuffer,
    EpisodeReplayBuffer,
    GFlowNetReplayBuffer,
    NaiveReplayBuffer,
)
from ding_buffer.buffers.engine import Engine
from ding_buffer.errors import SampleTimeoutError

TYPES = sorted(BUFFER_REGISTRY.get(name) and name for name in list(BUFFER_REGISTRY))
# types composed of whole buffers rather than of a table: each member is a preset on the engine
COMPOSITES = {'mixture': 'holds member buffers and splits a sample between them'}
ENGINE_TYPES = [name for name in TYPES if name not in COMPOSITES]

# a preset's methods that are not one statement handing the call on, and why
NOT_FORWARDERS = {
    '_config': "how a preset reads its config (deque translates DI-engine's wrapper keys)",
    'distributed_profile': 'a declaration computed from the config keys',
}


def depth(cls: type) -> int:
    """Levels of ``cls`` below ``IBuffer`` along its longest base chain."""
    if cls is IBuffer:
        return 0
    return 1 + max(depth(b) for b in cls.__bases__ if issubclass(b, IBuffer))


# presets that extend another preset as the peer's class does (DI-engine: Elastic / Sequence are Naive buffers;
# R2D2's is an episode buffer; torchgfn's diverse and terminating-state buffers are replay buffers)
EXTENDS = {
    'elastic': 'naive',
    'sequence': 'naive',
    'prioritized_episode': 'episode',
    'gfn_diverse': 'gfn',
    'terminating_state': 'gfn',
}


@pytest.mark.parametrize('name', ENGINE_TYPES)
def test_every_preset_sits_on_the_one_engine(name):
    """Directly, or through the one preset whose peer class it extends -- which sits directly on the engine."""
    cls = BUFFER_REGISTRY.get(name)
    base = BUFFER_REGISTRY.get(EXTENDS[name]) if name in EXTENDS else Engine
    assert cls.__bases__ == (base,), cls.__mro__
    assert depth(cls) == (3 if name in EXTENDS else 2)


def test_a_composite_is_made_of_presets_on_the_engine():
    mix = create_buffer(dict(type='mixture', members=dict(a=dict(type='naive'), b=dict(type='advanced'))))
    assert [type(m).__mro__[1] for m in mix.members.values()] == [Engine, Engine]
    mix.close()


def own_functions(cls: type):
    for key, value in vars(cls).items():
        funcs = [value.fget, value.fset] if isinstance(value, property) else [value]
        for f in funcs:
            if isinstance(f, (classmethod, staticmethod)):
                f = f.__func__
            if inspect.isfunction(f) and f.__qualname__.split('.')[0] == cls.__name__:
                yield key, f


@pytest.mark.parametrize('name', ENGINE_TYPES)
def test_a_preset_holds_no_behaviour_beyond_naming_its_table(name):
    """Each function a preset defines is one statement (after its docstring): it hands the call to the table."""
    cls = BUFFER_REGISTRY.get(name)
    assert cls.table is not None
    for key, f in own_functions(cls):
        if key in NOT_FORWARDERS:
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(f))).body[0].body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]
        assert len(body) == 1, f'{cls.__name__}.{key} holds {len(body)} statements'


# what the engine does for every push, sample, update and restore, in one order (``Engine._write`` / ``_sample`` /
# ``_update`` / ``load_state_dict``) and the parts it owns: a table only answers a ``Write`` / ``Written`` (push), a
# ``Request`` (sample), what to apply (update) or a ``Restored`` (restore)
ENGINE_STEPS = {
    '_write',
    '_make_room',
    '_admit',
    '_pushed',
    '_remove',
    '_evicted',
    '_capacity_rebuilt',
    '_build_engine',
    '_build_monitors',
    '_engine_state',
    '_engine_restored',
    '_limiter',
    '_uses',
    '_capacity',
    '_remover',
    '_periodic',
    '_counters',
    '_lock',
    '_tb',
    '_sample',
    '_sample_flow',
    '_drawn',
    '_refused',
    '_refuse',
    '_rng',
    '_due',
    '_update',
    '_count_update',
    '_spent',
}


def _table_sources():
    root = Path(inspect.getfile(Engine)).parent
    paths = sorted(root.glob('*table*.py'))
    assert len(paths) >= 7, paths  # table, slot, prioritized, episode, reward, chunk, deque
    return [(p.name, ast.parse(p.read_text())) for p in paths]


def test_no_table_runs_a_push_a_sample_or_an_update_the_engine_orders_them():
    """Tables answer ``prepare`` with a write, ``request(...)`` with a draw and ``update(info)`` with what to apply;
    they name none of the engine's steps or parts, nor its RNG."""
    for name, tree in _table_sources():
        used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} & ENGINE_STEPS
        assert not used, f'{name} reaches the engine for {sorted(used)}'


def test_tables_are_handed_the_config_and_name_instead_of_reading_the_engines():
    """The config and instance name come with the table's construction (a GFlowNet restore replaces the table's
    config, which the engine then adopts); no table or GFlowNet helper reads the engine's private copies."""
    paths = sorted(Path(inspect.getfile(Engine)).parent.glob('gfn_*.py'))
    trees = _table_sources() + [(p.name, ast.parse(p.read_text())) for p in paths]
    for name, tree in trees:
        used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} & {
            '_cfg',
            '_instance_name',
            '_deepcopy',
        }
        assert not used, f'{name} reads the engine for {sorted(used)}'


def test_no_table_imports_or_receives_the_engine():
    """The engine calls its table and lends it parts (``Parts``); no table module imports the engine, takes it in
    its constructor or holds a proxy of anything."""
    for name, tree in _table_sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert node.module not in ('engine', 'ding_buffer.buffers.engine'), f'{name} imports the engine'
            if isinstance(node, ast.FunctionDef) and node.name == '__init__':
                args = [a.arg for a in node.args.args]
                assert 'engine' not in args, f'{name}: a table constructor takes the engine ({args})'
            if isinstance(node, ast.Attribute):
                assert node.attr not in ('e', 'proxy'), f'{name} reaches {node.attr!r}'
    view = ast.parse(Path(inspect.getfile(Engine)).with_name('view.py').read_text())
    assert 'proxy' not in {n.attr for n in ast.walk(view) if isinstance(n, ast.Attribute)}


def test_every_table_is_a_table_and_forwards_nothing():
    """Each table class of the table modules is a ``Table`` (or mixes its verbs into one) and answers only what it
    defines: no ``__getattr__`` passing calls on to another object."""
    from ding_buffer.buffers.table import Table

    for name, tree in _table_sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                assert node.name != '__getattr__', f'{name} forwards attribute access'
    for name in ('deque', 'deque_prio'):
        buf = create_buffer(dict(type='deque', priority=name == 'deque_prio'))
        table = next(v for v in vars(buf).values() if isinstance(v, Table))
        assert type(table).__name__ == ('PrioritizedDequeTable' if name == 'deque_prio' else 'DequeTable')
        buf.close()


@pytest.mark.parametrize('name', ENGINE_TYPES)
def test_every_preset_sample_goes_through_the_engines_one_order(name):
    """A preset's ``sample`` hands its table's ``Request`` to ``Engine._sample`` (or is the engine's own)."""
    f = BUFFER_REGISTRY.get(name).sample
    if f is Engine.sample:
        return
    calls = [n for n in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(f)))) if isinstance(n, ast.Call)]
    assert any(isinstance(c.func, ast.Attribute) and c.func.attr == '_sample' for c in calls), name


@pytest.mark.parametrize(
    'name, base, expected',
    [
        ('elastic', NaiveReplayBuffer, True),
        ('sequence', NaiveReplayBuffer, True),
        ('advanced', NaiveReplayBuffer, False),
        ('prioritized_episode', EpisodeReplayBuffer, True),
        ('gfn_diverse', GFlowNetReplayBuffer, True),
        ('terminating_state', GFlowNetReplayBuffer, True),
        ('deque', AdvancedReplayBuffer, False),
    ],
)
def test_isinstance_follows_the_peers_class_nesting(name, base, expected):
    buf = create_buffer(dict(type=name))
    assert isinstance(buf, base) is expected and isinstance(buf, Engine)
    buf.close()


def test_a_preset_sharing_verbs_keeps_its_own_declarations():
    """``terminating_state`` takes gfn's verbs but declares its own item kind; the profile is computed for it."""
    ts, gfn = BUFFER_REGISTRY.get('terminating_state'), BUFFER_REGISTRY.get('gfn')
    assert ts.capabilities()['item_kind'] == 'state' and gfn.capabilities()['item_kind'] == 'trajectory'
    assert ts.distributed_profile({})['item_kind'] == 'state'
    assert ts.sample is gfn.sample and ts.push is gfn.push


# ---------------------------------------------------------------------------------------------- chunk
def frag(worker, fid, version=0):
    return dict(worker=worker, fid=fid, model_version=version, data={'obs': torch.full((2,), float(fid))})


@pytest.mark.timeout(30)
def test_chunk_waits_through_the_engine_and_wakes_on_a_push():
    buf = create_buffer(dict(type='chunk', fragments_per_chunk=2, seed=0))
    got = {}

    def learner():
        got['out'] = buf.sample(2, timeout=10)

    t = threading.Thread(target=learner)
    t.start()
    time.sleep(0.2)
    assert 'out' not in got  # waiting for a chunk
    buf.push([frag('w', 0), frag('w', 1)])
    t.join(10)
    assert [f['fid'] for f in got['out']] == [0, 1]
    assert [f['use'] for f in buf.sample(2)] == [2, 2]  # max_reuse=2: the chunk's last use, then it leaves
    with pytest.raises(SampleTimeoutError, match='could not sample 1 chunks within 0.2s: 0 of the 1 chunks'):
        buf.sample(2, timeout=0.2)
    assert buf.sample(2) is None  # without a timeout: refused at once, and counted
    stats = buf.stats()
    assert stats['push_items'] == 2 and stats['sample_calls'] == 2 and stats['refused_sample'] >= 1
    buf.close()


def test_chunk_keeps_the_engine_counters_in_its_state():
    a = create_buffer(dict(type='chunk', fragments_per_chunk=1, seed=0))
    a.push([frag('w', i) for i in range(3)])
    assert a.sample(5) is None and a.sample(2) is not None
    b = create_buffer(dict(type='chunk', fragments_per_chunk=1, seed=1))
    b.load_state_dict(a.state_dict())
    for key in ('push_items', 'refused_sample', 'sample_calls', 'sampled_items', 'chunks', 'fragments_received'):
        assert b.stats()[key] == a.stats()[key], key
    a.close()
    b.close()


def test_chunk_is_the_only_gate_of_its_model_versions():
    """A second, manager-side version gate would drop what the chunk buffer's own gate keeps: refused by name."""
    with pytest.raises(ValueError, match="distributed.max_version_lag' is 1, but type 'chunk' gates model versions"):
        create_buffer(dict(type='chunk', distributed=dict(backend='torch', max_version_lag=1)))


# ---------------------------------------------------------------------------------------------- deque
@pytest.mark.parametrize('priority', [False, True])
def test_deque_runs_on_the_engine_with_every_part_key(priority):
    buf = create_buffer(
        dict(
            type='deque',
            priority=priority,
            replay_buffer_size=8,
            max_use=2,
            max_staleness=100,
            removers=[dict(type='fifo')],
            seed=0,
        )
    )
    assert buf.inner.cfg.type == ('advanced' if priority else 'naive') and buf.cfg.type == 'deque'
    buf.push([{'obs': i, 'collect_iter': 0} for i in range(8)])
    for _ in range(100):  # one item a draw: each leaves at its second use
        if buf.sample(1, train_iter=1) is None:
            break
    stats = buf.stats()
    # every item left after two draws (max_use), counted by the engine like on any other type
    assert (stats['removed_by_use'], stats['sampled_items'], buf.count()) == (8, 16, 0), stats
    state = buf.state_dict()
    assert state['type'] == 'DequeReplayBuffer' and state['inner']['type'].endswith('ReplayBuffer')
    buf.close()


def test_deque_refuses_an_inner_state_of_the_other_kind():
    uniform = create_buffer(dict(type='deque', seed=0))
    uniform.push([{'obs': i} for i in range(3)])
    prioritized = create_buffer(dict(type='deque', priority=True, seed=0))
    before = prioritized.state_dict()
    with pytest.raises(ValueError, match="'inner' entry was made by 'NaiveReplayBuffer'"):
        prioritized.load_state_dict(uniform.state_dict())
    assert_same(before, prioritized.state_dict())
    uniform.close()
    prioritized.close()


def test_engine_counts_the_same_on_every_slot_type():
    """One push / sample / update flow: naive, elastic, advanced and deque count a refused and an accepted
    sample alike."""
    for cfg in (
        dict(type='naive'),
        dict(type='elastic'),
        dict(type='advanced'),
        dict(type='deque'),
    ):
        buf = create_buffer(dict(cfg, replay_buffer_size=4, seed=0))
        buf.push([{'obs': np.float32(i)} for i in range(2)])
        assert buf.sample(3) is None
        assert buf.sample(2) is not None
        s = buf.stats()
        assert (s['push_items'], s['sample_calls'], s['sampled_items'], s['refused_sample']) == (2, 1, 2, 1), cfg
        buf.close()


# ---------------------------------------------------------------------------------------------- lifetime
@pytest.mark.parametrize('name', TYPES)
def test_a_dropped_buffer_is_freed_at_once(name):
    """The engine owns its table, which holds nothing of the engine's but the parts it lends: with the cyclic
    garbage collector off, a buffer nobody refers to is gone as soon as the last reference is -- its memory and
    monitor thread too."""
    import gc
    import weakref

    cfg = dict(type=name, seed=0)
    if name in ('naive', 'advanced'):
        cfg['removers'] = [dict(type='fifo')]  # a capacity rule builds the table's view
    was = gc.isenabled()
    gc.disable()
    try:
        buf = create_buffer(cfg)
        if name in ('naive', 'elastic', 'advanced', 'deque'):
            buf.push([{'obs': i} for i in range(3)])
            buf.sample(1)
            assert buf.view.count() == 3
        elif name in ('gfn', 'gfn_diverse', 'terminating_state'):
            buf.push({'state': torch.ones(3, 2), 'log_reward': torch.zeros(3)})
        elif name == 'episode':
            buf.push([[{'obs': 0}, {'obs': 1}]])
        if name == 'deque':
            assert buf.inner.count() == 3
        ref = weakref.ref(buf)
        del buf
        assert ref() is None
    finally:
        if was:
            gc.enable()


# ---------------------------------------------------------------------------------------------- compatibility
def test_chunk_sample_keeps_its_arguments():
    """``timeout=0`` does not wait: ``SampleTimeoutError`` at once, as on every type (and no timeout: None);
    ``cur_learner_iter`` is taken but not read; its removals are the engine's removal counters, in chunks."""
    buf = create_buffer(dict(type='chunk', max_chunks=2, max_reuse=1, max_staleness=0, seed=0))
    with pytest.raises(SampleTimeoutError):
        buf.sample(1, timeout=0)
    assert buf.sample(1) is None
    buf.push([frag('w', i) for i in range(4)])  # 4 chunks of 1 into 2: 2 evicted
    assert len(buf.sample(1, cur_learner_iter=None)) == 1  # retired after its one use
    buf.update_model_version(1)  # the last one is stale
    s = buf.stats()
    assert (s['chunks_evicted'], s['chunks_retired'], s['chunks_dropped_stale']) == (2, 1, 1)
    assert (s['remove_count'], s['removed_by_use'], s['removed_by_staleness']) == (4, 1, 1)
    assert buf.view.count() == 0 and len(buf.view.ordered_slots()) == 0
    buf.model_version, buf.session_id = 3, 's'  # assignable, as they always were
    assert (buf.stats()['model_version'], buf.session_id) == (3, 's')
    for key, bad in (
        ('model_version', 'x'),
        ('model_version', float('nan')),
        ('model_version', 2**70),
        ('session_id', 7),
        ('session_id', 'x' * 200),
    ):
        with pytest.raises(ValueError, match=key.split('_')[0]):  # refused: it would break every later push
            setattr(buf, key, bad)
    assert (buf.model_version, buf.session_id) == (3, 's')
    buf.push(frag('w2', 0, version=3))  # a later call still works
    with pytest.raises(AttributeError):
        create_buffer(dict(type='advanced')).alpha = 0.1  # fixed by the config: the tree holds alpha-powered leaves
    buf.close()


def test_deque_inner_is_the_buffer_it_is_configured_as():
    buf = create_buffer(dict(type='deque', replay_buffer_size=8, priority=True, seed=0))
    buf.push([{'obs': i} for i in range(6)])
    inner = buf.inner
    assert isinstance(inner, AdvancedReplayBuffer) and type(inner).__name__ == 'AdvancedReplayBuffer'
    assert inner.cfg.type == 'advanced' and buf.cfg.type == 'deque'
    inner.beta = 0.9  # the schedule's value, not an attribute of its own
    assert buf.stats()['beta'] == 0.9
    batch = inner.sample(2, 0, sample_range=slice(-2, None))  # the advanced buffer's own verbs
    assert sorted(d['obs'] for d in batch) in ([4, 4], [4, 5], [5, 5])
    ids = [d['replay_unique_id'] for d in batch]
    idx = [d['replay_buffer_idx'] for d in batch]
    assert inner.update({'replay_unique_id': ids, 'replay_buffer_idx': idx, 'priority': [3.0, 3.0]})['updated'] == 2
    assert buf.stats()['max_priority'] == 3.0 + 1e-5 and inner.count() == buf.count() == 6
    state = inner.state_dict()
    assert state['type'] == 'AdvancedReplayBuffer' and buf.state_dict()['inner'].keys() - {'type'} <= state.keys()
    buf.close()
    naive = create_buffer(dict(type='deque', seed=0))
    assert isinstance(naive.inner, NaiveReplayBuffer) and naive.inner.cfg.type == 'naive'
    naive.close()


def test_deque_inner_keeps_working_once_the_deque_is_no_longer_referenced():
    """``create_buffer(...).inner`` (or ``inner = buf.inner; del buf``): the alias kept the deque weakly, so its
    count and len still worked while push, sample and state_dict raised a bare ReferenceError."""
    import gc

    inner = create_buffer(dict(type='deque', replay_buffer_size=8, priority=True, seed=0)).inner
    buf = create_buffer(dict(type='deque', replay_buffer_size=8, seed=0))
    plain = buf.inner
    del buf
    gc.collect()
    assert inner.push([{'obs': i} for i in range(5)]) == 5 and plain.push([{'obs': 1}]) == 1
    assert len(inner.sample(2, 0)) == 2 and plain.sample(1, 0)[0]['obs'] == 1
    assert inner.state_dict()['type'] == 'AdvancedReplayBuffer' and 'count=5' in repr(inner)
    held = create_buffer(dict(type='deque', seed=0))
    alias = held.inner
    assert held.inner is alias  # one alias while it is held
    gone = weakref.ref(held)
    del held, alias  # no cycle: freed (and its helpers closed) as soon as neither is referenced
    assert gone() is None


def test_deque_inner_state_round_trips_through_the_buffer_it_is_configured_as():
    """``inner.state_dict()`` loads into a stand-alone ``advanced`` buffer of the translated config, and back into
    the deque through ``inner.load_state_dict`` -- the deque's own entries (the last sampled batch) stay."""
    buf = create_buffer(dict(type='deque', replay_buffer_size=8, priority=True, seed=0))
    buf.push([{'obs': i} for i in range(6)])
    buf.sample(2, 0)  # the last batch: update() will apply to it
    state = buf.inner.state_dict()
    twin = create_buffer(dict(buf.inner.cfg))
    twin.load_state_dict(state)
    assert twin.count() == 6 and sorted(d['obs'] for d in twin.sample(6, 0)) == sorted(
        d['obs'] for d in buf.inner.sample(6, 0)
    )  # same items, same RNG state: the same draws
    buf.push([{'obs': 9}])
    before = buf.state_dict()
    with pytest.raises(ValueError, match='NaiveReplayBuffer'):  # a state of another type: refused, nothing changed
        buf.inner.load_state_dict({**state, 'type': 'NaiveReplayBuffer'})
    assert_same(buf.state_dict(), before)
    buf.inner.load_state_dict(state)
    after = buf.state_dict()
    assert buf.count() == 6 and after['last_batch'] == before['last_batch'] is not None
    assert_same(after['inner'], {k: v for k, v in state.items() if k != 'rng'})
    assert buf.update({'priority': [2.0, 2.0]}) == {'updated': 2, 'stale': 0}
    buf.close()
    twin.close()


@pytest.mark.parametrize(
    'cfg,item',
    [
        (dict(type='naive'), {'obs': 1}),
        (dict(type='advanced', storage=dict(type='tensor')), {'obs': torch.zeros(2)}),
        (dict(type='episode'), [{'obs': 1}, {'obs': 2}]),
        (dict(type='gfn'), dict(state=torch.zeros(1, 2), log_reward=torch.zeros(1))),
    ],
    ids=lambda x: x['type'] if isinstance(x, dict) and 'type' in x else '',
)
def test_why_not_sample_answers_as_the_sample_would_and_draws_nothing(cfg, item):
    from ding_buffer import create_buffer
    from ding_buffer.errors import SampleTimeoutError

    buf = create_buffer(dict(cfg, seed=0))
    why = buf.why_not_sample(1)
    assert why and buf.sample(1) is None  # empty: a reason, and the sample refuses
    with pytest.raises(SampleTimeoutError):
        buf.why_not_sample(1, timeout=0.05)
    for _ in range(3):
        buf.push([item] if cfg['type'] == 'episode' else item)
    with buf.lock:  # re-entrant: the question and the draw as one step
        before = buf.state_dict()
        assert buf.why_not_sample(2) == ''
        assert_same(buf.state_dict(), before)  # nothing drawn: the RNG, use counts and counters are as they were
        assert buf.sample(2) is not None


@pytest.mark.timeout(60)
@pytest.mark.parametrize('storage', ['list', 'tensor', 'memmap'])
def test_a_push_waiting_for_the_lock_when_close_runs_is_refused(storage, tmp_path):
    """A push past its own check, waiting for the lock while ``close()`` runs (here close() runs in the thread
    holding the lock), is refused once it gets the lock: nothing changes after ``close()`` returned, and no memmap
    file is made again."""
    st = dict(type='list') if storage == 'list' else dict(type='tensor')
    if storage == 'memmap':
        st['memmap_dir'] = str(tmp_path)
    buf = create_buffer(dict(type='naive', replay_buffer_size=8, storage=st))
    buf.push({'obs': torch.zeros(2)})
    out = []

    def push():
        try:
            out.append(buf.push({'obs': torch.ones(2)}))
        except RuntimeError as e:
            out.append(e)

    with buf.lock:  # stands in for another call in flight
        pusher = threading.Thread(target=push)
        pusher.start()
        time.sleep(0.2)  # the push passed its check and waits for the lock
        buf.close()
    pusher.join(30)
    assert len(out) == 1 and isinstance(out[0], RuntimeError) and 'closed' in str(out[0])
    assert buf.count() == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize('call', ['sample', 'why_not_sample'])
def test_a_timeout_bounds_the_wait_for_the_lock_too(call):
    """``sample`` / ``why_not_sample`` with a timeout raise ``SampleTimeoutError`` while another thread holds the
    buffer throughout, instead of waiting for the lock first and for data after."""
    buf = create_buffer(dict(type='naive', replay_buffer_size=8))
    answered = answer_while_held(buf.lock, lambda: getattr(buf, call)(4, timeout=0.2))
    assert len(answered) == 1 and isinstance(answered[0], SampleTimeoutError), answered
    assert 'another call held the buffer' in str(answered[0])


@pytest.mark.timeout(120)
def test_timeout_zero_is_not_failed_by_a_push_running_at_that_moment():
    """``timeout=0`` means 'do not wait for data': a buffer that can serve serves, even while another thread's
    pushes take the lock for a moment at a time."""
    buf = create_buffer(dict(type='naive', replay_buffer_size=1000, seed=0, storage=dict(type='tensor')))
    buf.extend({'obs': torch.zeros(64, 4)})
    stop = threading.Event()

    def pusher():
        while not stop.is_set():
            buf.push({'obs': torch.ones(4)})

    t = threading.Thread(target=pusher)
    t.start()
    try:
        failed = 0
        for _ in range(300):
            try:
                buf.sample(8, timeout=0)
            except SampleTimeoutError:
                failed += 1
    finally:
        stop.set()
        t.join(30)
    assert failed == 0


@pytest.mark.parametrize('where', ['counter', 'ring', 'empty slot'])
def test_saved_counters_that_disagree_with_the_saved_ring_are_refused(where):
    """What was pushed and removed is also what the ring counts (``next_uid``): a state where the two disagree is
    damaged, whichever side; one of them was dropped without a word."""
    cfg = dict(type='naive', replay_buffer_size=4, seed=0, removers=[dict(type='lifo')])
    buf = create_buffer(cfg)
    buf.push([{'obs': float(i)} for i in range(6)])
    state = buf.state_dict()
    if where == 'counter':
        state['counters']['push_items'] = 1000
    elif where == 'ring':
        state['storage']['ring']['next_uid'] = 1 << 20
    else:  # a plain ring (no rule): an empty slot's id says it holds an item
        del cfg['removers']
        buf = create_buffer(cfg)
        buf.push([{'obs': float(i)} for i in range(2)])
        state = buf.state_dict()
        state['storage']['ring']['uid'][3] = 12345
    fresh = create_buffer(cfg)
    before = fresh.state_dict()
    with pytest.raises(ValueError, match=r"push_items'\] is \d+, its storage ring counts \d+|empty slot has an id"):
        fresh.load_state_dict(state)
    assert_same(fresh.state_dict(), before)


@pytest.mark.parametrize('value', [1.5, -1, 'x', True, None])
def test_a_saved_counter_that_is_not_a_count_is_refused_by_name(value):
    """The engine's saved counters are ints >= 0: anything else is refused naming the counter (1.5 was loaded as
    1), with nothing changed."""
    buf = create_buffer(dict(type='advanced', replay_buffer_size=8, seed=0))
    buf.push({'obs': 1.0})
    state = buf.state_dict()
    before = copy.deepcopy(state)
    state['counters']['push_items'] = value
    with pytest.raises(ValueError, match=r"counters\['push_items'\] must be an int >= 0"):
        buf.load_state_dict(state)
    assert_same(before, buf.state_dict())


class _ClearingHook:
    """A user sampler that clears its buffer (``target``) in the middle of a draw."""

    target = None

    def draw(self, rng, m, size, replace):
        target, _ClearingHook.target = _ClearingHook.target, None
        if target is not None:
            target.clear()
        return rng.choice(m, size=size, replace=replace)


class _SamplingHook:
    """A user sampler that samples its buffer (``target``) in the middle of a draw."""

    target = None

    def draw(self, rng, m, size, replace):
        target, _SamplingHook.target = _SamplingHook.target, None
        if target is not None:
            target.sample(2)
        return rng.choice(m, size=size, replace=replace)


class _PushingHook:
    """An item whose deep copy pushes into its buffer (``target``) once."""

    target = None

    def __deepcopy__(self, memo):
        target, _PushingHook.target = _PushingHook.target, None
        if target is not None:
            target.push({'obs': 0})
        return _PushingHook()


def test_a_hook_that_changes_the_buffer_from_inside_its_own_call_is_refused():
    """A sampler of the user's that cleared the buffer mid-draw made the sample hand out items no longer stored (and
    counted their uses: the state no longer loaded); an item whose deepcopy pushed during state_dict() saved a torn
    state. Such a call raises RuntimeError naming both calls, the outer call fails whole, and the state loads."""
    from ding_buffer.control.samplers import SAMPLER_REGISTRY

    SAMPLER_REGISTRY.register('test_clearing_hook', replace=True)(_ClearingHook)
    cfg = dict(type='naive', replay_buffer_size=8, max_use=2, seed=0, sampler=dict(type='test_clearing_hook'))
    buf = create_buffer(cfg)
    buf.push([{'obs': i} for i in range(8)])
    before = buf.state_dict()
    _ClearingHook.target = buf
    with pytest.raises(RuntimeError, match=r"clear\(\) was called from inside its own sample\(\)"):
        buf.sample(4)
    assert _ClearingHook.target is None and buf.count() == 8
    assert_same(buf.state_dict(), before)
    assert len(buf.sample(4)) == 4  # (the hook unarmed: a plain draw)
    create_buffer(cfg).load_state_dict(buf.state_dict())

    # a nested sample: under max_use its removal rules took items from under the outer draw (a bare IndexError
    # after the buffer changed, or items handed out that were no longer stored)
    SAMPLER_REGISTRY.register('test_sampling_hook', replace=True)(_SamplingHook)
    nested = create_buffer(dict(cfg, sampler=dict(type='test_sampling_hook'), max_use=1))
    nested.push([{'obs': i} for i in range(4)])
    before = nested.state_dict()
    _SamplingHook.target = nested
    with pytest.raises(RuntimeError, match=r"sample\(\) was called from inside its own sample\(\)"):
        nested.sample(2)
    assert_same(nested.state_dict(), before)

    copying = create_buffer(dict(type='naive', replay_buffer_size=8, seed=0, deepcopy=True))
    copying.push([{'obs': _PushingHook()}, {'obs': 1}])
    _PushingHook.target = copying
    with pytest.raises(RuntimeError, match=r"push\(\) was called from inside its own state_dict\(\)"):
        copying.state_dict()
    assert copying.count() == 2 and copying.stats()['push_items'] == 2
    create_buffer(dict(type='naive', replay_buffer_size=8, seed=0)).load_state_dict(copying.state_dict())

    class Resizing:  # elastic's resize is refused by its own name
        def draw(self, rng, m, size, replace):
            elastic.resize(2)

    SAMPLER_REGISTRY.register('test_resizing_hook', replace=True)(Resizing)
    elastic = create_buffer(dict(type='elastic', replay_buffer_size=8, seed=0, sampler=dict(type='test_resizing_hook')))
    elastic.push([{'obs': i} for i in range(8)])
    with pytest.raises(RuntimeError, match=r"resize\(\) was called from inside its own sample\(\)"):
        elastic.sample(4)


class _YieldingSampler:
    """Lets other threads run in the middle of its draw (as any I/O would)."""

    def draw(self, rng, m, size, replace):
        time.sleep(0)
        return rng.choice(m, size=size, replace=replace)


def test_other_threads_are_never_refused_while_a_sample_runs_user_code():
    """The re-entry check read the sampling thread's mark twice without the lock: another thread's push or update
    could see it set, then find it reset, and raise a bare TypeError."""
    from ding_buffer.control.samplers import SAMPLER_REGISTRY

    SAMPLER_REGISTRY.register('test_yielding', replace=True)(_YieldingSampler)
    buf = create_buffer(dict(type='naive', replay_buffer_size=64, seed=0, sampler=dict(type='test_yielding')))
    buf.push([{'obs': i} for i in range(64)])
    stop, errors = threading.Event(), []

    def loop(call):
        while not stop.is_set():
            try:
                call()
            except Exception as e:  # noqa: BLE001 (any error is the failure)
                errors.append(repr(e))
                return

    calls = (
        [lambda: buf.sample(2)] * 2 + [lambda: buf.push({'obs': 0})] * 2 + [lambda: buf.update({'priority': []})] * 2
    )
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # (frequent switches: the window is easy to hit)
    try:
        threads = [threading.Thread(target=loop, args=(c,), daemon=True) for c in calls]
        for t in threads:
            t.start()
        time.sleep(1.5)
        stop.set()
        for t in threads:
            t.join(10)
    finally:
        sys.setswitchinterval(switch)
    assert not errors and not any(t.is_alive() for t in threads)


class _ClearingRule:
    """A remover whose ``before_sample`` clears its buffer (``target``) once."""

    target = None

    def before_sample(self, table, cur_learner_iter):
        target, _ClearingRule.target = _ClearingRule.target, None
        if target is not None:
            target.clear()
        return np.empty(0, dtype=np.int64)


def test_a_rule_that_changes_the_buffer_before_the_draw_is_refused_too():
    """The mark was set only around the draw: a remover's before_sample (run first, by sample and why_not_sample)
    could clear or push, and the engine then removed what another rule had named -- the item just pushed."""
    from ding_buffer.control.limits import REMOVER_REGISTRY, Remover

    REMOVER_REGISTRY.register('test_clearing_rule', replace=True)(type('R', (_ClearingRule, Remover), {}))
    buf = create_buffer(dict(type='naive', replay_buffer_size=8, seed=0, removers=[dict(type='test_clearing_rule')]))
    buf.push([{'obs': i} for i in range(4)])
    before = buf.state_dict()
    for call in (lambda: buf.sample(2), lambda: buf.why_not_sample(2)):
        _ClearingRule.target = buf
        with pytest.raises(RuntimeError, match=r"clear\(\) was called from inside its own (sample|why_not_sample)\(\)"):
            call()
        assert_same(buf.state_dict(), before)


@pytest.mark.skipif(not hasattr(os, 'fork'), reason='needs fork')
def test_a_fork_during_another_threads_sample_leaves_the_child_free_to_push():
    """The mark of a thread inside a sample survived a fork; a child thread given the same ident was refused every
    push. Marks are per thread now: the child's threads start unmarked."""
    entered, release = threading.Event(), threading.Event()

    class Waiting:
        def draw(self, rng, m, size, replace):
            entered.set()
            release.wait(10)
            return rng.choice(m, size=size, replace=replace)

    from ding_buffer.control.samplers import SAMPLER_REGISTRY

    SAMPLER_REGISTRY.register('test_waiting_sampler', replace=True)(Waiting)
    buf = create_buffer(dict(type='naive', replay_buffer_size=8, seed=0, sampler=dict(type='test_waiting_sampler')))
    buf.push([{'obs': i} for i in range(4)])
    sampler = threading.Thread(target=buf.sample, args=(2,), daemon=True)
    sampler.start()
    assert entered.wait(10)
    pid = os.fork()
    if pid == 0:  # the child: a new thread pushes (its lock is new; no sample runs here)
        code = [1]

        def push():
            buf.push({'obs': 9})
            code[0] = 0

        worker = threading.Thread(target=push)
        worker.start()
        worker.join(10)
        os._exit(code[0])
    release.set()
    sampler.join(10)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
