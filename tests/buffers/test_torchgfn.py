"""The GFlowNet buffers (``gfn``, ``gfn_diverse``, ``terminating_state``) with real torchgfn containers.

Everything here runs against the installed torchgfn (``Trajectories``, ``Transitions``, ``StatesContainer`` from
``HyperGrid``), and the capacity / diversity decisions are compared item by item with torchgfn's own
``ReplayBuffer``, ``NormBasedDiversePrioritizedReplayBuffer`` and ``TerminatingStateBuffer``.

Rewards are made distinct on purpose wherever the two implementations are compared: torchgfn orders the buffer
with an unstable ``torch.argsort``, so on equal rewards which item it keeps is unspecified (ours keeps the newest).
Distinct values are multiples of 1/1024, exact in float32 and float64, so every comparison below is exact.
"""

import copy
from collections import Counter

import numpy as np
import pytest
import torch

gfn = pytest.importorskip('gfn')  # CI installs torchgfn; this only protects a bare environment

from gfn.containers import StatesContainer, Trajectories, Transitions  # noqa: E402
from gfn.containers.replay_buffer import (  # noqa: E402
    NormBasedDiversePrioritizedReplayBuffer,
    ReplayBuffer,
    TerminatingStateBuffer,
)
from gfn.estimators import DiscretePolicyEstimator  # noqa: E402
from gfn.gym import HyperGrid  # noqa: E402
from gfn.preprocessors import KHotPreprocessor  # noqa: E402
from gfn.samplers import Sampler  # noqa: E402
from gfn.utils.modules import MLP  # noqa: E402
from helpers import assert_same  # noqa: E402

from ding_buffer import create_buffer  # noqa: E402

HEIGHT, NDIM = 8, 2


# ---------------------------------------------------------------------------------- fixtures
@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    np.random.seed(0)


@pytest.fixture(scope='module')
def env():
    return HyperGrid(ndim=NDIM, height=HEIGHT)


@pytest.fixture(scope='module')
def samplers(env):
    torch.manual_seed(1234)
    pre = KHotPreprocessor(env.height, env.ndim)
    pf = DiscretePolicyEstimator(MLP(pre.output_dim, env.n_actions), env.n_actions, preprocessor=pre)
    pb = DiscretePolicyEstimator(
        MLP(pre.output_dim, env.n_actions - 1), env.n_actions, preprocessor=pre, is_backward=True
    )
    return Sampler(pf), Sampler(pb)


class RewardPool:
    """Distinct log-rewards (multiples of 1/1024 in [-32, 32)), handed out in a random order, never repeated."""

    def __init__(self, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.values = (torch.randperm(1 << 16, generator=g).float() - (1 << 15)) / 1024
        self.pos = 0

    def take(self, n):
        out = self.values[self.pos : self.pos + n].clone()
        assert len(out) == n, 'reward pool exhausted'
        self.pos += n
        return out


@pytest.fixture
def pool():
    return RewardPool()


def trajectories(samplers, env, n, rewards=None):
    """Forward trajectories with log_probs and estimator outputs; ``rewards`` replaces the env's log-rewards."""
    tr = samplers[0].sample_trajectories(env, n=n, save_logprobs=True, save_estimator_outputs=True)
    assert tr.log_probs is not None and tr.estimator_outputs is not None
    if rewards is None:
        return tr
    return Trajectories(
        env=env,
        states=tr.states,
        actions=tr.actions,
        terminating_idx=tr.terminating_idx,
        is_backward=False,
        log_rewards=rewards,
        log_probs=tr.log_probs,
        estimator_outputs=tr.estimator_outputs,
    )


def terminal_states(env, tensor, rewards, conditions=None):
    """A StatesContainer whose every row is a terminating state."""
    states = env.states_from_tensor(tensor.long(), conditions=conditions)
    return StatesContainer(
        env=env, states=states, is_terminating=torch.ones(len(tensor), dtype=torch.bool), log_rewards=rewards
    )


def random_terminal_states(env, pool, n):
    return terminal_states(env, torch.randint(0, HEIGHT, (n, NDIM)), pool.take(n))


def copy_of(c):
    """An independent copy (torchgfn's ``extend`` may pad the *other* container's tensors in place)."""
    return c[torch.arange(len(c))]


# ---------------------------------------------------------------------------------- views
def _row(t):
    return tuple(t.reshape(-1).tolist())


def terminating_rewards(c):
    """Log-rewards aligned with ``c.terminating_states``."""
    r = c.log_rewards
    if isinstance(c, (Transitions, StatesContainer)):
        r = r[c.is_terminating]
    return r


def term_pairs(c):
    """Multiset of (terminating state [, its condition], log-reward)."""
    ts = c.terminating_states
    r = terminating_rewards(c)
    cond = ts.conditions
    assert len(r) == len(ts)
    return Counter(
        (_row(ts.tensor[i]),) + ((_row(cond[i]),) if cond is not None else ()) + (float(r[i]),) for i in range(len(ts))
    )


def item_keys(c):
    """One hashable key per item of the container (the whole item, not just its terminating state)."""
    if isinstance(c, Trajectories):
        s, a, t, r = c.states.tensor, c.actions.tensor, c.terminating_idx, c.log_rewards
        return [(_row(s[: int(t[i]) + 1, i]), _row(a[: int(t[i]), i]), float(r[i])) for i in range(len(c))]
    if isinstance(c, Transitions):
        return [
            (
                _row(c.states.tensor[i]),
                _row(c.next_states.tensor[i]),
                _row(c.actions.tensor[i]),
                bool(c.is_terminating[i]),
                float(c.log_rewards[i]),
            )
            for i in range(len(c))
        ]
    cond = c.states.conditions
    return [
        (_row(c.states.tensor[i]),)
        + ((_row(cond[i]),) if cond is not None else ())
        + (bool(c.is_terminating[i]), float(c.log_rewards[i]))
        for i in range(len(c))
    ]


def contents(buf):
    """Everything stored, via the public API: sampling ``count()`` items without replacement returns them all."""
    n = buf.count()
    if n == 0:
        return None
    out = buf.sample(n)
    assert out is not None and len(out) == n
    return out


def stored_pairs(buf):
    out = contents(buf)
    return Counter() if out is None else term_pairs(out)


def stored_keys(buf):
    out = contents(buf)
    return Counter() if out is None else Counter(item_keys(out))


def stats_without_sampled(buf, *also):
    s = buf.stats()
    for k in ('sampled', 'sampled_items', 'sample_calls') + also:  # ``contents`` samples
        s.pop(k)
    return s


def make_kind(kind, samplers, env, pool, n):
    """A container of ``kind`` with distinct log-rewards on its terminating items."""
    if kind == 'states_all_terminating':
        return random_terminal_states(env, pool, n)
    while True:
        tr = trajectories(samplers, env, n, pool.take(n))
        if kind == 'trajectories':
            return tr
        c = tr.to_transitions() if kind == 'transitions' else tr.to_states_container()
        assert kind in ('transitions', 'states'), kind
        # Every trajectory of the batch may exit at once: then every row is terminating. Such batches are kept
        # out of the general tests (see test_bug_rows_and_no_rows_batches_in_one_buffer for what they trigger).
        if not bool(c.is_terminating.all()):
            return c


CLASSES = {
    'trajectories': Trajectories,
    'transitions': Transitions,
    'states': StatesContainer,
    'states_all_terminating': StatesContainer,
}

# Regression tests for bugs found while writing these tests are the test_untracked_* ones below.


# ---------------------------------------------------------------------------------- helpers' sanity
def test_views_agree_across_torchgfn_conversions(samplers, env, pool):
    """The helpers themselves: a trajectory batch and its Transitions / StatesContainer have the same
    (terminating state, log-reward) multiset (torchgfn's own conversions keep the pairing)."""
    tr = trajectories(samplers, env, 16, pool.take(16))
    pairs = term_pairs(tr)
    assert sum(pairs.values()) == 16
    assert term_pairs(tr.to_transitions()) == pairs
    assert term_pairs(tr.to_states_container()) == pairs


# ---------------------------------------------------------------------------------- 1. push / sample
@pytest.mark.parametrize('kind', ['trajectories', 'transitions', 'states', 'states_all_terminating'])
@pytest.mark.parametrize('prioritized', [False, True], ids=['fifo', 'prioritized'])
def test_push_and_sample_each_container_kind(samplers, env, pool, kind, prioritized):
    # room for everything (at most 15 transitions per HyperGrid 8x8 trajectory): nothing is evicted here, capacity
    # has its own tests (evicting untracked Transitions / StatesContainer items: test_untracked_*)
    cap = 500
    buf = create_buffer(dict(type='gfn', replay_buffer_size=cap, prioritized_capacity=prioritized, seed=0))
    pushed_keys, pushed_pairs = Counter(), Counter()
    for _ in range(3):
        c = make_kind(kind, samplers, env, pool, 8)
        had_log_probs = getattr(c, 'log_probs', None) is not None
        buf.push(c)
        if kind in ('trajectories', 'transitions'):
            assert had_log_probs and c.log_probs is not None, "the caller's container must not be modified"
        pushed_keys.update(item_keys(c))
        pushed_pairs.update(term_pairs(c))
    n_pushed = sum(pushed_keys.values())
    assert buf.count() == n_pushed

    stored = buf.storage.container
    assert type(stored) is CLASSES[kind]
    if kind in ('trajectories', 'transitions'):
        assert stored.log_probs is None  # cleared, as torchgfn does: replayed data is re-evaluated
    if kind == 'trajectories':
        assert stored.estimator_outputs is None

    for size in (1, 5, buf.count()):
        out = buf.sample(size)
        assert type(out) is CLASSES[kind] and len(out) == size
        assert out.env is env
        keys, pairs = Counter(item_keys(out)), term_pairs(out)
        assert not keys - pushed_keys, 'sampled items that were never pushed'
        assert not pairs - pushed_pairs, 'sampled (terminating state, log_reward) pairs that were never pushed'
        if kind in ('trajectories', 'transitions'):
            assert out.log_probs is None
    # asked for more than stored: with replacement (torchgfn's rule), still only pushed items
    out = buf.sample(buf.count() + 3)
    assert len(out) == buf.count() + 3 and set(item_keys(out)) <= set(pushed_keys)
    # ``add`` is torchgfn's name for ``push``
    before = buf.stats()['pushed']
    more = make_kind(kind, samplers, env, pool, 4)
    assert buf.add(more) is None
    assert buf.stats()['pushed'] == before + len(more)
    buf.close()


@pytest.mark.parametrize('kind', ['trajectories', 'transitions', 'states'])
def test_all_sampled_items_exist_in_buffer_with_prioritized_sampling(samplers, env, pool, kind):
    buf = create_buffer(
        dict(type='gfn', replay_buffer_size=500, prioritized_capacity=True, prioritized_sampling=True, seed=3)
    )
    for _ in range(4):
        buf.push(make_kind(kind, samplers, env, pool, 6))
    stored = stored_keys(buf)
    out = buf.sample(7)
    assert type(out) is CLASSES[kind] and not Counter(item_keys(out)) - stored
    out = buf.sample(50)  # more than stored: with replacement
    assert len(out) == 50 and set(item_keys(out)) <= set(stored)


# ---------------------------------------------------------------------------------- 2. capacity
def test_prioritized_capacity_keeps_top_rewards_through_compaction(samplers, env, pool):
    cap, batch, pushes = 8, 16, 30
    buf = create_buffer(dict(type='gfn', replay_buffer_size=cap, prioritized_capacity=True, seed=0))
    tg = ReplayBuffer(env, capacity=cap, prioritized_capacity=True)
    everything = Counter()
    for _ in range(pushes):
        c = trajectories(samplers, env, batch, pool.take(batch))
        everything.update(item_keys(c))
        buf.push(copy_of(c))
        tg.add(copy_of(c))
        assert buf.count() == min(cap, sum(everything.values()))
        # the internal container is compacted: it never grows past 2 * (capacity + batch)
        assert len(buf.storage) <= 2 * (cap + batch)
    assert sum(everything.values()) == pushes * batch > 20 * cap  # many more than 2 x capacity went through
    best = sorted(everything, key=lambda k: k[-1])[-cap:]
    out = contents(buf)
    assert sorted(out.log_rewards.tolist()) == sorted(k[-1] for k in best)
    assert Counter(item_keys(out)) == Counter(best)
    assert buf.count() == cap == len(out)
    assert Counter(item_keys(tg.training_container)) == Counter(best)  # torchgfn agrees


@pytest.mark.parametrize(
    'kind',
    [
        'trajectories',
        'transitions',
        'states',
    ],
)
def test_fifo_keeps_newest_items(samplers, env, pool, kind):
    # batches smaller than the capacity (5 trajectories: about 15 transitions), so that evictions leave older
    # items behind and the container is compacted with items kept
    cap = 11 if kind == 'trajectories' else 40
    buf = create_buffer(dict(type='gfn', replay_buffer_size=cap, seed=0))
    tg = ReplayBuffer(env, capacity=cap)
    order = []
    for _ in range(25):
        c = make_kind(kind, samplers, env, pool, 5)
        order.extend(item_keys(c))
        buf.push(copy_of(c))
        tg.add(copy_of(c))
        newest = Counter(order[-cap:])
        out = contents(buf)
        assert Counter(item_keys(out)) == newest
        assert Counter(item_keys(tg.training_container)) == newest
        assert buf.stats()['unique_terminating_states'] == (
            len({_row(x) for x in out.terminating_states.tensor}) if kind == 'trajectories' else -1
        )
    assert len(buf.storage) <= 2 * (cap + 5 * 15)


# ---------------------------------------------------------------------------------- 3. diverse
def _compare_diverse(env, batches, cap, cutoff, p):
    ours = create_buffer(
        dict(type='gfn_diverse', replay_buffer_size=cap, cutoff_distance=cutoff, p_norm_distance=p, seed=0)
    )
    tg = NormBasedDiversePrioritizedReplayBuffer(env, capacity=cap, cutoff_distance=cutoff, p_norm_distance=p)
    for step, c in enumerate(batches):
        ours.push(copy_of(c))
        tg.add(copy_of(c))
        expected = term_pairs(tg.training_container)
        assert stored_pairs(ours) == expected, f'push {step}: stored items differ from torchgfn'
        assert ours.count() == len(tg)
    return ours


@pytest.mark.parametrize('p', [1.0, 2.0])
@pytest.mark.parametrize('cutoff', [0.0, 1.0, 2.0])
def test_diverse_matches_torchgfn_states_container(env, pool, cutoff, p):
    # 12 random cells of an 8 x 8 grid per batch: duplicates and close neighbours are common
    batches = [random_terminal_states(env, pool, 12) for _ in range(10)]
    ours = _compare_diverse(env, batches, cap=10, cutoff=cutoff, p=p)
    s = ours.stats()
    assert s['filter_checked'] > 0 and s['rejected_by_reward'] + s['rejected_by_distance'] > 0
    if cutoff > 0:
        assert s['rejected_by_distance'] > 0  # the distance filter was actually exercised
    ours.close()


@pytest.mark.parametrize('p', [1.0, 2.0])
@pytest.mark.parametrize('cutoff', [0.0, 1.0, 2.0])
def test_diverse_matches_torchgfn_trajectories(samplers, env, pool, cutoff, p):
    batches = [trajectories(samplers, env, 12, pool.take(12)) for _ in range(8)]
    ours = _compare_diverse(env, batches, cap=10, cutoff=cutoff, p=p)
    out = contents(ours)
    assert type(out) is Trajectories and out.log_probs is None and out.estimator_outputs is None
    ours.close()


def test_diverse_rejects_duplicate_of_stored_state_even_with_higher_reward(env, pool):
    cap = 4
    buf = create_buffer(dict(type='gfn_diverse', replay_buffer_size=cap))
    grid = torch.tensor([[0, 0], [3, 3], [5, 5], [7, 7]])
    buf.push(terminal_states(env, grid, torch.tensor([0.0, 1.0, 2.0, 3.0])))
    # full: duplicates (cutoff 0) are refused whatever their reward; a new cell enters, evicting the lowest
    assert buf.push(terminal_states(env, torch.tensor([[3, 3], [1, 6]]), torch.tensor([10.0, 9.0]))) == 1
    assert stored_pairs(buf) == Counter({((3, 3), 1.0): 1, ((5, 5), 2.0): 1, ((7, 7), 3.0): 1, ((1, 6), 9.0): 1})
    s = buf.stats()
    assert (s['rejected_by_distance'], s['rejected_by_reward'], s['filter_checked']) == (1, 0, 2)


# ---------------------------------------------------------------------------------- 4. vs ReplayBuffer
@pytest.mark.parametrize(
    'kind',
    [
        'trajectories',
        'transitions',
        'states',
        'states_all_terminating',
    ],
)
def test_prioritized_capacity_matches_torchgfn_replay_buffer(samplers, env, pool, kind):
    cap = 10
    ours = create_buffer(dict(type='gfn', replay_buffer_size=cap, prioritized_capacity=True, seed=0))
    tg = ReplayBuffer(env, capacity=cap, prioritized_capacity=True)
    for step in range(20):
        c = make_kind(kind, samplers, env, pool, 7)
        ours.push(copy_of(c))
        tg.add(copy_of(c))
        out = contents(ours)
        # non-terminating Transitions / StatesContainer rows all carry -inf: torchgfn's tie order among them is
        # unspecified, so the reward multiset is what must agree; terminating items have distinct rewards
        assert sorted(out.log_rewards.tolist()) == sorted(tg.training_container.log_rewards.tolist()), step
        assert term_pairs(out) == term_pairs(tg.training_container), step
        if kind in ('trajectories', 'states_all_terminating'):
            assert Counter(item_keys(out)) == Counter(item_keys(tg.training_container)), step
        assert ours.stats()['unique_terminating_states'] == (
            -1 if kind in ('transitions', 'states') else len({_row(x) for x in out.terminating_states.tensor})
        ), step
    ours.close()


# ---------------------------------------------------------------------------------- 5. terminating_state
def test_terminating_state_buffer_from_trajectories(samplers, env, pool):
    buf = create_buffer(dict(type='terminating_state', replay_buffer_size=200))
    expected = Counter()
    for _ in range(3):
        tr = trajectories(samplers, env, 16, pool.take(16))
        buf.push(tr)
        expected.update(term_pairs(tr))
    out = contents(buf)
    assert type(out) is StatesContainer and bool(out.is_terminating.all())
    assert term_pairs(out) == expected
    assert Counter((k[0], k[2]) for k in item_keys(out)) == expected  # every stored row is a terminating state
    assert buf.count() == 48
    # with the env's own rewards (no explicit log_rewards on the container) the env's log-rewards are stored
    tr = trajectories(samplers, env, 8)
    buf2 = create_buffer(dict(type='terminating_state', replay_buffer_size=50))
    buf2.push(tr)
    assert stored_pairs(buf2) == term_pairs(tr)
    assert torch.equal(contents(buf2).log_rewards.sort().values, env.log_reward(tr.terminating_states).sort().values)


@pytest.mark.parametrize('kind', ['transitions', 'states'])
def test_terminating_state_buffer_keeps_only_terminating_rewards(samplers, env, pool, kind):
    """Transitions / StatesContainer carry one log-reward per row (-inf on non-terminating rows); only the
    terminating rows' rewards belong to the terminating states. (torchgfn 2.4.1's TerminatingStateBuffer passes
    all rows' rewards with only the terminating states, so its StatesContainer constructor fails an assertion.)"""
    buf = create_buffer(dict(type='terminating_state', replay_buffer_size=200))
    expected = Counter()
    for _ in range(3):
        tr = trajectories(samplers, env, 10, pool.take(10))
        c = tr.to_transitions() if kind == 'transitions' else tr.to_states_container()
        assert len(c) > 10  # there are non-terminating rows
        assert buf.push(c) == 10
        expected.update(term_pairs(tr))
    out = contents(buf)
    assert type(out) is StatesContainer and bool(out.is_terminating.all())
    assert term_pairs(out) == expected
    assert not torch.isinf(out.log_rewards).any()
    assert buf.stats()['zero_reward_items'] == 0
    # any container kind goes into the same terminating-state buffer
    tr = trajectories(samplers, env, 5, pool.take(5))
    assert buf.push(tr) == 5
    expected.update(term_pairs(tr))
    assert stored_pairs(buf) == expected


def test_terminating_state_prioritized_matches_torchgfn(samplers, env, pool):
    cap = 12
    ours = create_buffer(dict(type='terminating_state', replay_buffer_size=cap, prioritized_capacity=True))
    tg = TerminatingStateBuffer(env, cap, prioritized_capacity=True)
    for step in range(10):
        tr = trajectories(samplers, env, 9, pool.take(9))
        ours.push(copy_of(tr))
        tg.add(copy_of(tr))
        assert stored_pairs(ours) == term_pairs(tg.training_container), step
    assert ours.count() == cap


# ---------------------------------------------------------------------------------- 6. conditions
def _conditions_supported():
    from gfn.states import States

    prop = getattr(States, 'conditions', None)
    return isinstance(prop, property) and prop.fset is not None


def test_diverse_same_state_different_condition_is_distinct(env):
    if not _conditions_supported():
        pytest.skip('this torchgfn version cannot attach conditions to States (no States.conditions setter)')

    def batch(cells, conds, rewards):
        return terminal_states(
            env,
            torch.tensor(cells),
            torch.tensor(rewards, dtype=torch.float32),
            conditions=torch.tensor(conds, dtype=torch.get_default_dtype()),
        )

    cap = 4
    ours = create_buffer(dict(type='gfn_diverse', replay_buffer_size=cap))
    tg = NormBasedDiversePrioritizedReplayBuffer(env, capacity=cap)
    batches = [
        # fill: one cell under four conditions (below capacity everything is stored)
        batch([[2, 2]] * 4, [[0.0], [1.0], [2.0], [3.0]], [0.0, 1.0, 2.0, 3.0]),
        # full: (2,2)|4 is new; (2,2)|1 is a stored pair; (2,2)|5 twice in the batch: only the better one
        batch([[2, 2], [2, 2], [2, 2], [2, 2]], [[4.0], [1.0], [5.0], [5.0]], [10.0, 11.0, 9.0, 8.0]),
    ]
    for b, admitted in zip(batches, (4, 2)):
        assert ours.push(copy_of(b)) == admitted
        tg.add(copy_of(b))
    expected = Counter(
        {((2, 2), (2.0,), 2.0): 1, ((2, 2), (3.0,), 3.0): 1, ((2, 2), (4.0,), 10.0): 1, ((2, 2), (5.0,), 9.0): 1}
    )
    assert stored_pairs(ours) == expected
    assert term_pairs(tg.training_container) == expected  # torchgfn concatenates conditions the same way
    s = ours.stats()
    assert s['unique_terminating_states'] == 4  # one cell, four (state, condition) pairs
    assert s['rejected_by_distance'] == 2 and s['rejected_by_reward'] == 0
    out = contents(ours)
    assert out.states.conditions is not None and out.states.conditions.shape == (4, 1)


@pytest.mark.parametrize('p', [1.0, 2.0])
@pytest.mark.parametrize('cutoff', [0.0, 1.0])
def test_diverse_with_conditions_matches_torchgfn(env, pool, cutoff, p):
    if not _conditions_supported():
        pytest.skip('this torchgfn version cannot attach conditions to States (no States.conditions setter)')
    batches = []
    for _ in range(8):
        cells = torch.randint(0, 3, (10, NDIM))  # few cells: the condition decides most comparisons
        conds = torch.randint(0, 3, (10, 1)).to(torch.get_default_dtype()) / 2  # 0, 0.5, 1: exact floats
        batches.append(terminal_states(env, cells, pool.take(10), conditions=conds))
    ours = _compare_diverse(env, batches, cap=8, cutoff=cutoff, p=p)
    assert ours.stats()['rejected_by_distance'] > 0


# ---------------------------------------------------------------------------------- 7. save / load
# Transitions / StatesContainer-with-intermediate-rows cases get room for everything: evicting their items after a
# compaction of untracked items has its own tests (test_untracked_*).
SAVE_CASES = [
    ('gfn', 'trajectories', dict(prioritized_capacity=True)),
    ('gfn', 'transitions', dict(prioritized_capacity=False, replay_buffer_size=500)),
    ('gfn', 'states', dict(prioritized_capacity=True, prioritized_sampling=True, replay_buffer_size=500)),
    ('gfn_diverse', 'states_all_terminating', dict(cutoff_distance=1.0, p_norm_distance=1.0)),
    ('gfn_diverse', 'trajectories', dict(cutoff_distance=0.0, p_norm_distance=2.0)),
    ('terminating_state', 'trajectories', dict(prioritized_capacity=True)),
    ('terminating_state', 'transitions', dict()),
]


@pytest.mark.parametrize('btype,kind,extra', SAVE_CASES, ids=[f'{b}-{k}' for b, k, _ in SAVE_CASES])
def test_save_load_round_trip(tmp_path, samplers, env, pool, btype, kind, extra):
    extra = dict(extra)
    cap = extra.pop('replay_buffer_size', 9)
    buf = create_buffer(dict(type=btype, replay_buffer_size=cap, seed=0, **extra))
    for _ in range(5):
        buf.push(make_kind(kind, samplers, env, pool, 6))
    path = str(tmp_path / 'buffer.pt')
    buf.save_data(path)
    # unique_terminating_states of Transitions / mixed StatesContainers: see test_bug_round_trip_unique_states
    skip = ('unique_terminating_states',) if btype == 'gfn' and kind in ('transitions', 'states') else ()
    keys_before, count_before, stats_before = stored_keys(buf), buf.count(), stats_without_sampled(buf, *skip)
    settings_before = buf.state_dict()['settings']

    # a fresh buffer knows no environment: rebuilding torchgfn containers needs one
    other_cfg = dict(type=btype, replay_buffer_size=50, seed=1)
    if btype == 'gfn_diverse':
        other_cfg.update(cutoff_distance=-1.0, p_norm_distance=3.0)
    fresh = create_buffer(other_cfg)
    with pytest.raises(ValueError, match='env'):
        fresh.load_data(path)
    assert fresh.count() == 0 and fresh.storage is None and fresh.capacity == 50

    # a state in memory, as a file: refused without an environment, rebuilt with one
    in_memory = create_buffer(other_cfg)
    with pytest.raises(ValueError, match='env'):
        in_memory.load_state_dict(buf.state_dict())
    assert in_memory.count() == 0 and in_memory.capacity == 50
    in_memory.load_state_dict(buf.state_dict(), env=env)
    assert in_memory.count() == count_before and stored_keys(in_memory) == keys_before

    # another env's states would sample silently with it (Trajectories failed with a RuntimeError): refused
    with pytest.raises(ValueError, match=r'state_shape \(3,\)'):
        fresh.load_data(path, env=HyperGrid(ndim=3, height=HEIGHT))
    assert fresh.count() == 0 and fresh.capacity == 50

    fresh.load_data(path, env=env)
    assert fresh.count() == count_before
    assert fresh.capacity == cap
    assert fresh.state_dict()['settings'] == settings_before
    assert stats_without_sampled(fresh, *skip) == stats_before
    assert stored_keys(fresh) == keys_before
    out = fresh.sample(3)
    expected_cls = StatesContainer if btype == 'terminating_state' else CLASSES[kind]
    assert type(out) is expected_cls and out.env is env

    # the loaded buffer behaves exactly like the original from here on (settings included)
    if btype == 'gfn_diverse':
        # stored states again with better rewards: refused by the saved filter (cutoff >= 0), the fresh buffer's
        # own cutoff -1 would admit them all
        stored = contents(buf)
        nxt = type(stored)(**_with_rewards_kwargs(stored, pool.take(len(stored)) + 100))
    else:
        nxt = make_kind(kind, samplers, env, pool, 6)
    n_buf, n_fresh = buf.push(copy_of(nxt)), fresh.push(copy_of(nxt))
    assert n_buf == n_fresh
    if btype == 'gfn_diverse':
        assert n_buf == 0
    assert stored_keys(fresh) == stored_keys(buf)
    assert stats_without_sampled(fresh, *skip) == stats_without_sampled(buf, *skip)

    # a buffer that already holds a container of the kind reuses that container's env
    again = create_buffer(dict(type=btype, replay_buffer_size=cap, **extra))
    again.push(make_kind(kind, samplers, env, pool, 2))
    again.load_data(path)
    assert stored_keys(again) == keys_before


@pytest.mark.parametrize('module', ['gfn.containers.rtates_container', 'gfn.containersX', 'gfn.gym'])
def test_a_state_naming_another_container_module_is_refused_and_changes_nothing(env, pool, module):
    buf = create_buffer(dict(type='gfn', replay_buffer_size=6, seed=0))
    buf.push(random_terminal_states(env, pool, 8))

    def renamed(x):  # the class the state names, in another module (a damaged byte, or a hand-edited state)
        if isinstance(x, dict):
            return {k: renamed(v) for k, v in x.items()}
        if isinstance(x, str) and x.startswith('gfn.containers.states_container:'):
            return x.replace('gfn.containers.states_container', module)
        return x

    _refused_load(renamed(buf.state_dict()), env, f"{module}:StatesContainer", seed=1, size=6)


def _refused_load(state, env, match, seed=0, size=8):
    """A fresh ``gfn`` buffer refuses ``state`` (``ValueError`` matching ``match``) and is unchanged."""
    fresh = create_buffer(dict(type='gfn', replay_buffer_size=size, seed=seed))
    before = fresh.state_dict()
    with pytest.raises(ValueError, match=match):
        fresh.load_state_dict(state, env=env)
    assert_same(fresh.state_dict(), before)


def test_trajectories_whose_terminating_idx_passes_their_steps_are_refused(samplers, env):
    """One flipped bit in a saved ``terminating_idx`` (5 -> 16777221) was loaded, and the stored time axis grew to
    it: gigabytes for 6 trajectories. Refused when loaded and when pushed, with nothing changed."""
    buf = create_buffer(dict(type='gfn', replay_buffer_size=8, seed=0))
    tr = trajectories(samplers, env, 6)
    buf.push(tr)
    steps = tr.states.tensor.shape[0] - 1
    state = buf.state_dict()
    saved = state['store']['tensors']
    saved['terminating_idx'] = saved['terminating_idx'].clone()
    saved['terminating_idx'][-1] = 300_000
    _refused_load(state, env, f"terminating_idx holds 300000, outside the 0..{steps} steps")
    bad = Trajectories(
        env=env,
        states=tr.states,
        actions=tr.actions,
        terminating_idx=torch.full_like(tr.terminating_idx, steps + 1),
        is_backward=False,
        log_rewards=tr.log_rewards,
    )
    before = buf.state_dict()
    with pytest.raises(ValueError, match=f"holds {steps + 1}, outside the 0..{steps} steps"):
        buf.push(bad)
    negative = Trajectories(  # accepted, it broke terminating_states of the sampled trajectories later
        env=env, states=tr.states, actions=tr.actions, terminating_idx=-tr.terminating_idx, log_rewards=tr.log_rewards
    )
    with pytest.raises(ValueError, match=f"holds -[0-9]+, outside the 0..{steps} steps"):
        buf.push(negative)
    assert_same(buf.state_dict(), before)


def test_saved_trajectories_of_expanded_tensors_are_refused(samplers, env):
    """A crafted state's states / actions expanded (stride 0) over 10**10 steps are a few hundred bytes, pass the
    steps check (the steps are 'held'), and the store would copy the whole time axis out: 1.28 TB."""
    buf = create_buffer(dict(type='gfn', replay_buffer_size=8, seed=0))
    tr = trajectories(samplers, env, 4)
    buf.push(tr)
    state = buf.state_dict()
    saved, big = state['store']['tensors'], 10**10
    saved['states'] = saved['states'][:1, :1].expand(big + 1, *saved['states'].shape[1:])
    saved['actions'] = saved['actions'][:1, :1].expand(big, *saved['actions'].shape[1:])
    saved['terminating_idx'] = torch.full_like(saved['terminating_idx'], big)
    _refused_load(state, env, r"saved Trajectories.states of shape \(10000000001, .*held in fewer bytes")


@pytest.mark.parametrize('key', ['log_rewards', 'terminating_idx'])
def test_a_saved_container_tensor_under_a_damaged_name_is_refused(samplers, env, key):
    """'log_rewards' renamed by a flipped bit was ignored: the container came back without them and samples carried
    the env's rewards, while the buffer ranked by the saved ones."""
    buf = create_buffer(dict(type='gfn', replay_buffer_size=8, seed=0))
    buf.push(trajectories(samplers, env, 6))
    state = buf.state_dict()
    saved = state['store']['tensors']
    saved[key[:-1] + 'r'] = saved.pop(key)
    _refused_load(state, env, f"{key[:-1]}r|{key}")


def _with_rewards_kwargs(c, rewards):
    if isinstance(c, Trajectories):
        return dict(
            env=c.env, states=c.states, actions=c.actions, terminating_idx=c.terminating_idx, log_rewards=rewards
        )
    return dict(env=c.env, states=c.states, is_terminating=c.is_terminating, log_rewards=rewards)


# ---------------------------------------------------------------------------------- 8. mixing kinds
@pytest.mark.parametrize('btype', ['gfn', 'gfn_diverse'])
def test_mixing_container_kinds_raises_and_changes_nothing(samplers, env, pool, btype):
    buf = create_buffer(dict(type=btype, replay_buffer_size=12, seed=0))
    for _ in range(3):
        buf.push(trajectories(samplers, env, 6, pool.take(6)))
    keys, stats = stored_keys(buf), stats_without_sampled(buf)
    tr = trajectories(samplers, env, 6, pool.take(6))
    bad = [
        tr.to_transitions(),
        tr.to_states_container(),
        random_terminal_states(env, pool, 4),
        {'state': torch.zeros(3, NDIM), 'log_reward': torch.zeros(3)},
        [{'state': torch.zeros(NDIM), 'log_reward': torch.tensor(0.0)}],
    ]
    for data in bad:
        with pytest.raises(TypeError):
            buf.push(data)
        assert stored_keys(buf) == keys and stats_without_sampled(buf) == stats
        assert type(buf.storage.container) is Trajectories
    buf.push(tr)  # the right kind still goes in
    assert buf.stats()['pushed'] == stats['pushed'] + 6


def test_dict_buffer_refuses_containers_and_container_buffer_refuses_dicts(samplers, env, pool):
    dict_buf = create_buffer(dict(type='gfn', replay_buffer_size=10))
    dict_buf.push({'state': torch.zeros(3, NDIM), 'log_reward': torch.zeros(3)})
    with pytest.raises(TypeError):
        dict_buf.push(trajectories(samplers, env, 4, pool.take(4)))
    assert dict_buf.count() == 3
    ts = create_buffer(dict(type='terminating_state', replay_buffer_size=10))
    ts.push(trajectories(samplers, env, 4, pool.take(4)))
    before = stored_pairs(ts)
    with pytest.raises(TypeError):
        ts.push({'state': torch.zeros(3, NDIM), 'log_reward': torch.zeros(3)})
    assert stored_pairs(ts) == before


def test_diverse_refuses_containers_without_one_terminating_state_per_item(samplers, env, pool):
    """Transitions and mixed StatesContainers have fewer terminating states than items: no diversity
    representation per item, so ``gfn_diverse`` refuses them up front. (torchgfn 2.4.1 stores them while below
    capacity, then raises IndexError once full: its batch mask has one entry per terminating state.)"""
    tr = trajectories(samplers, env, 6, pool.take(6))
    for c in (tr.to_transitions(), tr.to_states_container()):
        buf = create_buffer(dict(type='gfn_diverse', replay_buffer_size=10))
        with pytest.raises(ValueError, match='terminating state'):
            buf.push(c)
        assert buf.count() == 0 and buf.storage is None


# ---------------------------------------------------------------------------------- 9. no log_rewards
@pytest.mark.parametrize(
    'cfg',
    [
        dict(type='gfn', prioritized_capacity=True),
        dict(type='gfn', prioritized_sampling=True),
        dict(type='gfn_diverse'),
    ],
    ids=['prioritized_capacity', 'prioritized_sampling', 'diverse'],
)
def test_backward_trajectories_without_log_rewards_are_refused(samplers, env, pool, cfg):
    fwd = trajectories(samplers, env, 6, pool.take(6))
    bwd = samplers[1].sample_trajectories(env, states=fwd.terminating_states)
    assert isinstance(bwd, Trajectories) and bwd.is_backward and bwd.log_rewards is None
    # torchgfn refuses them the same way
    tg = ReplayBuffer(env, capacity=10, prioritized_capacity=True)
    with pytest.raises(ValueError, match='log_rewards'):
        tg.add(bwd)

    empty = create_buffer(dict(cfg, replay_buffer_size=10))
    with pytest.raises(ValueError, match='log_rewards'):
        empty.push(bwd)
    assert empty.count() == 0 and empty.storage is None
    empty.push(fwd.to_states_container() if cfg['type'] == 'gfn' else random_terminal_states(env, pool, 3))
    assert empty.count() > 0  # the failed push fixed no container kind

    buf = create_buffer(dict(cfg, replay_buffer_size=10, seed=0))
    buf.push(fwd)
    buf.push(trajectories(samplers, env, 6, pool.take(6)))  # full: the diverse filter is active
    keys, stats = stored_keys(buf), stats_without_sampled(buf)
    with pytest.raises(ValueError, match='log_rewards'):
        buf.push(bwd)
    assert stored_keys(buf) == keys and stats_without_sampled(buf) == stats
    # a forward Trajectories with log_rewards=None derives them from the env (torchgfn's property): accepted
    plain = trajectories(samplers, env, 4)
    assert plain._log_rewards is None
    buf.push(plain)
    assert buf.stats()['pushed'] == stats['pushed'] + 4


# ---------------------------------------------------------------------------------- 10. stats
@pytest.mark.parametrize('btype', ['gfn', 'gfn_diverse', 'terminating_state'])
def test_stats_match_stored_items(samplers, env, pool, btype):
    buf = create_buffer(dict(type=btype, replay_buffer_size=15, prioritized_capacity=True, seed=0))
    for _ in range(3):
        buf.push(trajectories(samplers, env, 8, pool.take(8)))
    # the same 8 trajectories twice with the best rewards: the plain buffers keep 15 of these 16 items, so at
    # most 8 distinct terminating states; the diverse one admits each state once
    a = trajectories(samplers, env, 8, pool.take(8) + 100)
    buf.push(a)
    buf.push(Trajectories(**_with_rewards_kwargs(a, pool.take(8) + 100)))
    s = buf.stats()
    out = contents(buf)
    r = terminating_rewards(out)
    states = {_row(x) for x in out.terminating_states.tensor}
    assert s['size'] == buf.count() == len(out) == 15
    assert s['log_reward_min'] == float(r.min()) and s['log_reward_max'] == float(r.max())
    assert s['log_reward_mean'] == pytest.approx(float(r.double().mean()))
    assert s['unique_terminating_states'] == len(states)
    if btype != 'gfn_diverse':
        assert len(states) <= 8  # the count is really a distinct count
    assert s['pushed'] == 40 and s['capacity'] == 15


def test_stats_transitions_have_no_single_terminating_state(samplers, env, pool):
    buf = create_buffer(dict(type='gfn', replay_buffer_size=30, seed=0))
    tr = trajectories(samplers, env, 8, pool.take(8))
    t = tr.to_transitions()
    buf.push(t)
    s = buf.stats()
    assert s['unique_terminating_states'] == -1
    assert s['size'] == min(30, len(t))
    out = contents(buf)
    finite = out.log_rewards[torch.isfinite(out.log_rewards)]
    assert s['log_reward_min'] == float(finite.min()) and s['log_reward_max'] == float(finite.max())
    assert s['zero_reward_items'] == int(torch.isinf(out.log_rewards).sum())
    # a StatesContainer with intermediate rows is the same case
    buf2 = create_buffer(dict(type='gfn', replay_buffer_size=100))
    buf2.push(tr.to_states_container())
    assert buf2.stats()['unique_terminating_states'] == -1
    # an empty buffer
    assert create_buffer(dict(type='gfn')).stats()['unique_terminating_states'] == 0


# ---------------------------------------------------------------------------------- bugs
def _mixed_transitions(samplers, env, pool, n_traj=10, min_rest=1):
    """Transitions of ``n_traj`` trajectories with at least ``min_rest`` non-terminating rows."""
    while True:
        t = trajectories(samplers, env, n_traj, pool.take(n_traj)).to_transitions()
        if int((~t.is_terminating).sum()) >= min_rest:
            return t


def test_untracked_compaction_of_untracked_container_items(samplers, env, pool):
    """The same mixed Transitions batch (n > 16 rows) pushed again and again into a FIFO buffer of capacity n + 8:
    the third push compacts the container keeping 8 items, the fourth evicts items pushed after the compaction."""
    t = _mixed_transitions(samplers, env, pool, min_rest=8)
    assert len(t) > 16
    cap = len(t) + 8
    buf = create_buffer(dict(type='gfn', replay_buffer_size=cap, seed=0))
    order = []
    for step in range(6):
        buf.push(t)  # raises KeyError(0) at step 3
        order.extend(item_keys(t))
        assert buf.count() == min(cap, len(order))
        assert stored_keys(buf) == Counter(order[-cap:])


def test_untracked_compaction_reports_unique_states_for_transitions(samplers, env, pool):
    """Only the statistic: after the first compaction a Transitions buffer claims 1 distinct terminating state."""
    t = _mixed_transitions(samplers, env, pool, min_rest=8)
    assert len(t) > 16
    buf = create_buffer(dict(type='gfn', replay_buffer_size=len(t) + 8, seed=0))
    for _ in range(3):
        buf.push(t)
    assert len(buf.storage) == buf.count()  # the container was compacted on the third push
    assert buf.stats()['unique_terminating_states'] == -1


@pytest.mark.parametrize('prioritized', [False, True], ids=['fifo', 'prioritized'])
def test_untracked_rows_and_no_rows_batches_in_one_buffer(samplers, env, pool, prioritized):
    """A Transitions batch made only of terminating transitions (e.g. every trajectory exited at once) has one
    terminating state per item and gets tracked; a mixed or non-terminating batch does not. Evicting an untracked
    item then fails. No compaction is involved (5 + 5 slots for capacity 5)."""
    t = _mixed_transitions(samplers, env, pool, min_rest=8)
    term = t[t.is_terminating]  # every row terminating
    rest = t[~t.is_terminating]  # no row terminating (log-reward -inf)
    buf = create_buffer(dict(type='gfn', replay_buffer_size=5, prioritized_capacity=prioritized, seed=0))
    buf.push(term[:2])
    buf.push(rest[:3])
    expected = Counter(item_keys(term[:2]) + item_keys(rest[:3]))
    assert stored_keys(buf) == expected
    if prioritized:
        buf.push(term[2:4])  # evicts two of the -inf items: KeyError(0)
        assert buf.count() == 5
        # which -inf item stays is a tie: compare the terminating items only
        assert Counter(k for k in stored_keys(buf).elements() if k[3]) == Counter(item_keys(term[:4]))
    else:
        buf.push(rest[3:8])  # evicts all five, rest[:3] among them: KeyError(0)
        assert stored_keys(buf) == Counter(item_keys(rest[3:8]))
    assert buf.stats()['unique_terminating_states'] == -1  # a Transitions buffer: items have no single state


def test_untracked_round_trip_unique_states(tmp_path, samplers, env, pool):
    buf = create_buffer(dict(type='gfn', replay_buffer_size=5, prioritized_capacity=True, seed=0))
    sc = trajectories(samplers, env, 10, pool.take(10)).to_states_container()
    assert not bool(sc.is_terminating.all())
    buf.push(sc)  # the 5 best rows are terminating ones (the others have log-reward -inf)
    before = buf.stats()['unique_terminating_states']
    assert before == -1
    path = str(tmp_path / 'b.pt')
    buf.save_data(path)
    loaded = create_buffer(dict(type='gfn'))
    loaded.load_data(path, env=env)
    assert loaded.stats()['unique_terminating_states'] == before  # reads the distinct count instead
    for _ in range(4):  # and the loaded buffer then fails on evicting untracked items
        loaded.push(make_kind('states', samplers, env, pool, 10))


# ---------------------------------------------------------------------------------- 11. stored in place (ring)
# torchgfn's containers are stored one tensor per field, written in place at each item's slot (slots are reused);
# what comes back must equal what indexing one concatenated container would give, padding rows included.
def _long_pool(samplers, env, n, seed):
    """``n`` forward trajectories with distinct log-rewards, their padding rows (past each item's sink state)
    overwritten with random values, and 0-3 extra all-padding steps per batch of 8: padding is then visible."""
    g = torch.Generator().manual_seed(seed)
    out = []
    rewards = RewardPool(seed)
    while sum(len(b) for b in out) < n:
        tr = trajectories(samplers, env, 8, rewards.take(8))
        extra = int(torch.randint(0, 4, (1,), generator=g))
        s = torch.cat([tr.states.tensor, torch.full((extra, 8, NDIM), -1)])
        a = torch.cat([tr.actions.tensor, torch.full((extra, 8, 1), -1)])
        t = tr.terminating_idx
        pad_s = torch.arange(s.shape[0])[:, None] > t[None, :]
        s[pad_s] = torch.randint(0, HEIGHT, (int(pad_s.sum()), NDIM), generator=g)
        pad_a = torch.arange(a.shape[0])[:, None] >= t[None, :]
        a[pad_a] = torch.randint(0, NDIM + 1, (int(pad_a.sum()), 1), generator=g)
        out.append(
            Trajectories(
                env=env,
                states=env.states_from_tensor(s),
                actions=env.actions_from_tensor(a),
                terminating_idx=t.clone(),
                log_rewards=tr.log_rewards.clone(),
            )
        )
    return out


def _split_by_length(batches, size):
    """The same items regrouped shortest first: each batch brings a longer trajectory than any stored one."""
    everything = batches[0][torch.arange(len(batches[0]))]
    for b in batches[1:]:
        everything.extend(b[torch.arange(len(b))])
    order = torch.argsort(everything.terminating_idx, stable=True)
    return [everything[order[i : i + size]] for i in range(0, len(order), size)]


class TrajectoryModel:
    """Brute force: each admitted item as torchgfn's indexing of its pushed batch gives it (the batch restricted to
    the admitted rows, trimmed to their longest item), keyed by its (distinct) log-reward."""

    def __init__(self, env, cap, prioritized):
        self.env, self.cap, self.prioritized = env, cap, prioritized
        self.items = {}  # log-reward -> (states column, actions column, terminating_idx)
        self.order = []  # log-rewards, oldest first

    def push(self, tr):
        r = tr.log_rewards.tolist()
        if self.prioritized:  # the batch items that make the top ``cap`` of stored + batch
            best = set(sorted(self.order + r)[-self.cap :])
            rows = [i for i, x in enumerate(r) if x in best]
        else:
            rows = list(range(len(r)))
        part = tr[torch.tensor(rows, dtype=torch.long)]
        for i, x in enumerate(part.log_rewards.tolist()):
            self.items[x] = (part.states.tensor[:, i], part.actions.tensor[:, i], int(part.terminating_idx[i]))
            self.order.append(x)
        keep = sorted(self.order)[-self.cap :] if self.prioritized else self.order[-self.cap :]
        self.order = [x for x in self.order if x in set(keep)]

    def expected(self, r, steps):
        """Item ``r`` padded (sink state / dummy action) or trimmed to ``steps`` actions."""
        s, a, t = self.items[r]
        sf, dummy = self.env.States.sf, self.env.Actions.dummy_action
        s = torch.cat([s, sf.expand(max(0, steps + 1 - len(s)), NDIM)])[: steps + 1]
        a = torch.cat([a, dummy.expand(max(0, steps - len(a)), 1)])[:steps]
        return s, a, t


def assert_trajectories_match(buf, model):
    out = contents(buf)
    assert type(out) is Trajectories and out.log_probs is None and out.estimator_outputs is None
    assert sorted(out.log_rewards.tolist()) == sorted(model.order)
    steps = out.actions.tensor.shape[0]
    assert steps == max(model.items[r][2] for r in model.order)  # trimmed to the longest stored item
    for i, r in enumerate(out.log_rewards.tolist()):
        s, a, t = model.expected(r, steps)
        assert int(out.terminating_idx[i]) == t
        assert torch.equal(out.states.tensor[:, i], s), f'states of item {r} (padding included)'
        assert torch.equal(out.actions.tensor[:, i], a), f'actions of item {r} (padding included)'


@pytest.mark.parametrize('cap', [20, 70])
@pytest.mark.parametrize('prioritized', [False, True], ids=['fifo', 'prioritized'])
def test_trajectories_after_wrapping_equal_brute_force_model(samplers, env, prioritized, cap):
    """Batches of 8 (evictions split earlier batches; prioritized: arbitrary slots reused, batches partly
    admitted); capacity 70 also outgrows the first allocation. First shortest first, so the stored length grows
    again and again, then mixed lengths."""
    pool = _long_pool(samplers, env, 160, seed=5)
    batches = _split_by_length(pool[:8], 8) + pool[8:]
    buf = create_buffer(dict(type='gfn', replay_buffer_size=cap, prioritized_capacity=prioritized, seed=0))
    model = TrajectoryModel(env, cap, prioritized)
    for step, tr in enumerate(batches):
        buf.push(tr)
        model.push(tr)
        assert buf.count() == len(model.order), step
        assert_trajectories_match(buf, model)
    # a sample is a copy: writing into it changes nothing stored
    out = buf.sample(5)
    out.states.tensor.fill_(3)
    out.actions.tensor.fill_(0)
    out.log_rewards.fill_(0.0)
    assert_trajectories_match(buf, model)


def _states_batch(env, g, rewards, n, conditions):
    """A StatesContainer with random cells, a random terminating mask and distinct log-rewards on every row."""
    cond = torch.randint(0, 3, (n, 2), generator=g).to(torch.get_default_dtype()) if conditions else None
    states = env.states_from_tensor(torch.randint(0, HEIGHT, (n, NDIM), generator=g), conditions=cond)
    return StatesContainer(
        env=env, states=states, is_terminating=torch.rand(n, generator=g) < 0.7, log_rewards=rewards.take(n)
    )


@pytest.mark.parametrize(
    'conditions,lazy', [(False, False), (True, False), (False, True)], ids=['plain', 'conditions', 'lazy']
)
def test_states_container_fifo_after_wrapping_equals_last_items(env, conditions, lazy):
    if conditions and not _conditions_supported():
        pytest.skip('this torchgfn version cannot attach conditions to States')
    g, rewards = torch.Generator().manual_seed(2), RewardPool(2)
    cap = 137 if not lazy else 41  # wrapped; the stored tensors grow on the way (64, 128, 137 items)
    buf = create_buffer(dict(type='gfn', replay_buffer_size=cap, lazy_sort=lazy, seed=0))
    tg = ReplayBuffer(env, capacity=cap)
    order, stored = [], []
    for step in range(50):
        c = _states_batch(env, g, rewards, int(torch.randint(1, 12, (1,), generator=g)), conditions)
        order.extend(item_keys(c))
        stored.extend(item_keys(c))
        if not lazy or len(stored) >= 2 * cap:  # lazy: truncated once stored + incoming reach 2 x capacity
            stored = stored[-cap:]
        buf.push(c)
        tg.add(copy_of(c))
        out = contents(buf)
        assert type(out) is StatesContainer
        assert Counter(item_keys(out)) == Counter(stored), step
        assert Counter(item_keys(tg.training_container)) == Counter(order[-cap:])


def test_transitions_fifo_after_wrapping_equals_last_items(samplers, env, pool):
    cap = 45
    buf = create_buffer(dict(type='gfn', replay_buffer_size=cap, seed=0))
    order = []
    for step in range(12):
        t = trajectories(samplers, env, 4, pool.take(4)).to_transitions()
        order.extend(item_keys(t))
        buf.push(t)
        out = contents(buf)
        assert type(out) is Transitions and out.log_probs is None
        assert Counter(item_keys(out)) == Counter(order[-cap:]), step


@pytest.mark.parametrize('kind', ['trajectories', 'states'])
def test_state_dict_round_trip_after_wrapping(tmp_path, samplers, env, kind):
    """After the slots were reused many times: state_dict / load_state_dict and save_data / load_data give a buffer
    holding the same items that then evicts and samples like the original (sampler-made trajectories: padded with
    the sink state, as torchgfn pads; a save keeps rows up to the longest stored item)."""
    g, rewards = torch.Generator().manual_seed(4), RewardPool(4)
    if kind == 'trajectories':
        make = lambda: trajectories(samplers, env, 9, rewards.take(9))  # noqa: E731
    else:
        make = lambda: _states_batch(env, g, rewards, 9, conditions=False)  # noqa: E731
    cfg = dict(type='gfn', replay_buffer_size=23, prioritized_capacity=True, seed=0)
    buf = create_buffer(cfg)
    for _ in range(12):
        buf.push(make())
    state = buf.state_dict()
    assert state['layout'] == 2 and len(state['slots']) == buf.count()

    again = create_buffer(cfg)
    again.push(make())  # holds a container of the kind: its env rebuilds the saved ones
    again.load_state_dict(state)
    path = str(tmp_path / 'b.pt')
    buf.save_data(path)
    loaded = create_buffer(dict(type='gfn'))
    loaded.load_data(path, env=env)
    for other in (again, loaded):
        assert_same(other.state_dict(), state)
        assert stored_keys(other) == stored_keys(buf)
    for _ in range(6):
        c = make()
        for b in (buf, again, loaded):
            b.push(copy_of(c))
        assert stored_keys(again) == stored_keys(buf) == stored_keys(loaded)
    for other in (again, loaded):  # the same items at the same slots (counters differ: ``stored_keys`` samples)
        assert_same(_placed(other.state_dict()), _placed(buf.state_dict()))


def _placed(state):
    return {k: state[k] for k in ('store', 'index', 'slots', 'free')}


@pytest.mark.parametrize('btype', ['gfn', 'terminating_state'])
def test_conditions_that_come_or_go_are_refused_while_states_are_counted(env, pool, btype):
    """Counted states are their rows with the conditions: a push whose states gain or lose conditions would mix
    rows of two widths, so it is refused with nothing changed (and the stored conditions are kept)."""
    grid = torch.randint(0, HEIGHT, (4, NDIM))
    for first, second in ((torch.rand(4, 1), None), (None, torch.rand(4, 1))):
        buf = create_buffer(dict(type=btype, replay_buffer_size=10, seed=0))
        buf.push(terminal_states(env, grid, pool.take(4), conditions=first))
        unique = buf.stats()['unique_terminating_states']
        before = copy.deepcopy(buf.state_dict())
        with pytest.raises(ValueError, match='values per item'):
            buf.push(terminal_states(env, grid, pool.take(4), conditions=second))
        assert_same(buf.state_dict(), before)
        assert buf.stats()['unique_terminating_states'] == unique == len({_row(x) for x in grid})
        kept = buf.training_container.states.conditions
        assert (kept is None) == (first is None)


def test_a_restored_empty_buffer_takes_the_conditions_of_its_next_push(env, pool, tmp_path):
    """An empty buffer saved from states without conditions, loaded, then given states with conditions keeps
    them, as torchgfn's extend of an empty container does, and counts the (state, condition) pairs."""
    buf = create_buffer(dict(type='gfn', replay_buffer_size=10, seed=0))
    buf.push(terminal_states(env, torch.zeros(2, NDIM), pool.take(2)))
    buf.clear()
    path = str(tmp_path / 'empty.pt')
    buf.save_data(path)
    fresh = create_buffer(dict(type='gfn', replay_buffer_size=10, seed=0))
    fresh.load_data(path, env=env)
    conditions = torch.tensor([[0.0], [1.0]])
    assert fresh.push(terminal_states(env, torch.zeros(2, NDIM), pool.take(2), conditions=conditions)) == 2
    assert torch.equal(fresh.training_container.states.conditions, conditions)
    assert fresh.stats()['unique_terminating_states'] == 2


def test_failed_pushes_leave_state_dict_unchanged(samplers, env, pool):
    """Items of another shape or device, a wrong class, bad log-rewards: refused before anything is stored."""
    buf = create_buffer(dict(type='gfn', replay_buffer_size=10, seed=0))
    for _ in range(3):
        buf.push(random_terminal_states(env, pool, 6))  # wrapped once
    before = copy.deepcopy(buf.state_dict())
    other_env = HyperGrid(ndim=NDIM + 1, height=HEIGHT)
    bad = [
        (ValueError, terminal_states(other_env, torch.zeros(4, NDIM + 1), pool.take(4))),  # another state shape
        (TypeError, trajectories(samplers, env, 4, pool.take(4))),  # another class
        (ValueError, terminal_states(env, torch.zeros(3, NDIM), torch.tensor([0.0, float('nan'), 1.0]))),
    ]
    for err, c in bad:
        with pytest.raises(err):
            buf.push(c)
        assert_same(buf.state_dict(), before)
    tbuf = create_buffer(dict(type='gfn', replay_buffer_size=10, seed=0))
    tbuf.push(trajectories(samplers, env, 6, pool.take(6)))
    before = copy.deepcopy(tbuf.state_dict())
    other = Sampler(
        DiscretePolicyEstimator(
            MLP(KHotPreprocessor(HEIGHT, NDIM + 1).output_dim, other_env.n_actions),
            other_env.n_actions,
            preprocessor=KHotPreprocessor(HEIGHT, NDIM + 1),
        )
    )
    with pytest.raises(ValueError, match='states'):
        tbuf.push(other.sample_trajectories(other_env, n=3))
    assert_same(tbuf.state_dict(), before)


def test_fields_follow_torchgfn_extend_rules(env):
    """A push without conditions drops them for every stored item, and a wider log-reward dtype widens the stored
    ones -- what torchgfn's own ``extend`` (its ReplayBuffer) does."""
    if not _conditions_supported():
        pytest.skip('this torchgfn version cannot attach conditions to States')
    g, rewards = torch.Generator().manual_seed(6), RewardPool(6)
    buf = create_buffer(dict(type='gfn', replay_buffer_size=50, seed=0))
    tg = ReplayBuffer(env, capacity=50)
    first = _states_batch(env, g, rewards, 5, conditions=True)
    plain = _states_batch(env, g, rewards, 4, conditions=False)
    wide = StatesContainer(
        env=env,
        states=env.states_from_tensor(torch.randint(0, HEIGHT, (3, NDIM))),
        is_terminating=torch.ones(3, dtype=torch.bool),
        log_rewards=rewards.take(3).double(),
    )
    for c in (first, plain, wide):
        buf.push(copy_of(c))
        tg.add(copy_of(c))
        out = contents(buf)
        ref = tg.training_container
        assert (out.states.conditions is None) == (ref.states.conditions is None)
        assert out.log_rewards.dtype == ref.log_rewards.dtype
        assert sorted(out.log_rewards.tolist()) == sorted(ref.log_rewards.tolist())
        assert Counter(item_keys(out)) == Counter(item_keys(ref))
    assert out.states.conditions is None and out.log_rewards.dtype == torch.float64


# ---------------------------------------------------------------------------------- wrapping pushes, brute force
@pytest.mark.parametrize('btype,prioritized', [('gfn', False), ('gfn', True), ('terminating_state', False)])
def test_ring_over_many_wrapping_pushes_matches_brute_force(tmp_path, env, pool, btype, prioritized):
    """StatesContainers into the in-place ring: hundreds of pushes that wrap it, items also leaving in the middle
    (``max_use``), save/load round trips. After every step the stored items are the brute-force model's (FIFO:
    the newest; prioritized: the best log-rewards, all distinct) and ``unique_terminating_states`` is a
    brute-force count of distinct states."""
    rng = np.random.default_rng(3)
    cap = 23
    cfg = dict(type=btype, replay_buffer_size=cap, seed=0, max_use=1, prioritized_capacity=prioritized)
    buf = create_buffer(cfg)
    model = []  # (log_reward, state row), oldest first
    for step in range(120):
        n = int(rng.integers(1, 2 * cap))
        states = torch.from_numpy(rng.integers(0, 3, size=(n, NDIM)))
        r = pool.take(n)
        buf.push(terminal_states(env, states, r))
        model += [(float(r[i]), _row(states[i])) for i in range(n)]
        if len(model) > cap:
            best = set(sorted(model, reverse=True)[:cap]) if prioritized else set(model[-cap:])
            model = [it for it in model if it in best]
        if rng.random() < 0.3:
            out = buf.sample(int(rng.integers(1, buf.count() + 1)))  # sampled once: gone (max_use=1)
            gone = {float(x) for x in out.log_rewards}
            model = [it for it in model if it[0] not in gone]
        if rng.random() < 0.1:
            path = str(tmp_path / f'b{step}.pt')
            buf.save_data(path)
            buf = create_buffer(cfg)
            buf.load_data(path, env=env)
        stored = sorted(buf.state_dict()['index']['log_reward'].tolist())  # sampling would use the items up
        assert stored == sorted(it[0] for it in model), step
        assert buf.stats()['unique_terminating_states'] == len({it[1] for it in model}), step
    assert Counter(item_keys(contents(buf))) == Counter((s, True, r) for r, s in model)


# ---------------------------------------------------------------------------------- torchgfn drop-in surface
# What torchgfn's own training loops and examples do with a buffer: found by putting ours into them.
DROP_IN = [
    ('gfn', 'trajectories'),
    ('gfn', 'states_all_terminating'),
    ('gfn_diverse', 'trajectories'),
    ('gfn_diverse', 'states_all_terminating'),
    ('terminating_state', 'trajectories'),
    ('terminating_state', 'states_all_terminating'),
]


def _empty(c):
    return c[torch.zeros(0, dtype=torch.long)]


@pytest.mark.parametrize('btype,kind', DROP_IN, ids=[f'{b}-{k}' for b, k in DROP_IN])
def test_empty_container_push_is_a_no_op(samplers, env, pool, btype, kind):
    """torchgfn's buffers take an empty container as a no-op (its samplers hand back empty batches); ours raised
    ``RuntimeError: cannot reshape tensor of 0 elements``. First push or later, nothing changes."""
    buf = create_buffer(dict(type=btype, replay_buffer_size=40, seed=0))
    first = make_kind(kind, samplers, env, pool, 12)
    before = buf.state_dict()
    assert len(_empty(first)) == 0
    assert buf.push(_empty(first)) == 0
    assert_same(buf.state_dict(), before)
    assert buf.training_container is None  # an empty push fixes nothing, not even the container kind
    assert buf.push(first) == 12
    before = buf.state_dict()
    assert buf.push(_empty(make_kind(kind, samplers, env, pool, 5))) == 0
    assert_same(buf.state_dict(), before)
    assert buf.count() == 12 and len(buf.sample(12)) == 12


@pytest.mark.parametrize('btype', ['gfn', 'gfn_diverse', 'terminating_state'])
def test_torchgfn_sample_keyword_and_capacity_key(samplers, env, pool, btype):
    """``sample(n_samples=...)`` (torchgfn's keyword) and the ``capacity`` key (torchgfn's name for
    ``replay_buffer_size``); both names of one value must agree."""
    buf = create_buffer(dict(type=btype, capacity=30, seed=0))
    assert buf.capacity == 30
    buf.push(make_kind('trajectories', samplers, env, pool, 40))
    assert buf.count() == 30
    assert len(buf.sample(n_samples=16)) == 16
    with pytest.raises(TypeError, match='n_samples'):
        buf.sample(4, n_samples=4)
    with pytest.raises(TypeError, match='n_samples'):
        buf.sample()
    assert create_buffer(dict(type=btype, capacity=30, replay_buffer_size=30)).capacity == 30
    assert create_buffer(dict(type=btype, capacity=np.int64(30), replay_buffer_size=30)).capacity == 30  # one number
    # every place that checks a section before building (jobs, the distributed wrapper) reads the alias too
    from easydict import EasyDict

    from ding_buffer.base import get_buffer_cls
    from ding_buffer.config import check_section

    section = EasyDict(type=btype, capacity=30, distributed=dict(backend='torch'))
    assert check_section(get_buffer_cls(section), section).replay_buffer_size == 30
    with pytest.raises(ValueError, match="'capacity' = 30 and 'replay_buffer_size' = 20 disagree"):
        create_buffer(dict(type=btype, capacity=30, replay_buffer_size=20))


@pytest.mark.parametrize('btype,kind', DROP_IN, ids=[f'{b}-{k}' for b, k in DROP_IN])
def test_torchgfn_attributes(samplers, env, pool, btype, kind):
    """The attributes torchgfn users read: ``training_container`` (every stored item, oldest first, of the stored
    kind -- compared with torchgfn's own buffer fed the same batches), ``env``, ``device``,
    ``prioritized_capacity``, ``prioritized_sampling``."""
    prioritized = btype == 'gfn_diverse'
    buf = create_buffer(dict(type=btype, replay_buffer_size=1000, seed=0, prioritized_sampling=prioritized))
    theirs = {
        'gfn': lambda: ReplayBuffer(env, capacity=1000),
        'gfn_diverse': lambda: NormBasedDiversePrioritizedReplayBuffer(env, capacity=1000),
        'terminating_state': lambda: TerminatingStateBuffer(env, capacity=1000),
    }[btype]()
    assert buf.training_container is None and buf.env is None
    assert buf.device == torch.device('cpu')
    assert buf.prioritized_capacity is prioritized and buf.prioritized_sampling is prioritized
    for _ in range(3):
        c = make_kind(kind, samplers, env, pool, 10)
        buf.push(c)
        theirs.add(copy_of(c))
    assert buf.env is env and theirs.device == buf.device
    ours_tc = buf.training_container
    assert type(ours_tc) is type(theirs.training_container) and len(ours_tc) == len(theirs.training_container) == 30
    assert Counter(item_keys(ours_tc)) == Counter(item_keys(theirs.training_container))
    if not prioritized:  # FIFO below capacity: torchgfn keeps the pushes in order, as ours does (oldest first)
        assert item_keys(ours_tc) == item_keys(theirs.training_container)
    buf.clear()
    assert len(buf.training_container) == 0


def test_clear_starts_counting_unique_states_again():
    """A StatesContainer with a non-terminating row turns the unique-state count off (-1): it stayed -1 after
    clear(), on an empty buffer and after every later push of terminating states."""
    env = HyperGrid(ndim=2, height=8)
    states = env.States(torch.tensor([[1, 2], [3, 4], [1, 2]]))
    lr = torch.tensor([0.5, 1.0, 0.5])
    partial = StatesContainer(env=env, states=states, is_terminating=torch.tensor([True, True, False]), log_rewards=lr)
    clean = StatesContainer(env=env, states=states, is_terminating=torch.ones(3, dtype=torch.bool), log_rewards=lr)
    buf = create_buffer(dict(type='gfn', replay_buffer_size=3, seed=0))
    buf.push(partial)
    assert buf.stats()['unique_terminating_states'] == -1
    buf.clear()
    assert buf.stats()['unique_terminating_states'] == 0
    buf.push(clean)
    assert buf.stats()['unique_terminating_states'] == 2
    buf.push(partial)
    assert buf.stats()['unique_terminating_states'] == -1


def _states_of_dtype(env, lo, n, dtype):
    states = env.States(((torch.arange(NDIM * n).reshape(n, NDIM) + lo) % HEIGHT).to(dtype))
    rewards = torch.arange(n, dtype=torch.float32) + lo
    return StatesContainer(env=env, states=states, is_terminating=torch.ones(n, dtype=torch.bool), log_rewards=rewards)


@pytest.mark.parametrize('btype', ['gfn', 'gfn_diverse'])
@pytest.mark.parametrize('cap', [3, 4])
def test_a_push_whose_dtype_cannot_be_stored_is_refused_before_anything_changes(env, btype, cap):
    """States torch cannot join with the stored ones (uint16 beside int64), or cannot write by index (float8), are
    refused with a ValueError naming the field before any item is evicted -- into a full buffer (its new items
    take the evicted slots) or one with room -- and the buffer keeps working."""
    buf = create_buffer(dict(type=btype, replay_buffer_size=cap, seed=0))
    with pytest.raises(ValueError, match=r'StatesContainer\.states would be stored as torch\.float8_e4m3fn'):
        buf.push(_states_of_dtype(env, 0, 3, torch.float8_e4m3fn))
    assert buf.count() == 0
    buf.push(_states_of_dtype(env, 0, 3, torch.int64))
    before = buf.state_dict()
    with pytest.raises(
        ValueError, match=r'StatesContainer\.states has dtype torch\.uint16, the stored ones torch\.int64'
    ):
        buf.push(_states_of_dtype(env, 10, 3, torch.uint16))
    assert_same(buf.state_dict(), before)
    assert buf.push(_states_of_dtype(env, 20, 3, torch.int64)) >= 1 and buf.count() == cap  # (diverse: filtered)
    assert buf.stats()['unique_terminating_states'] == len(
        {tuple(r) for r in buf.training_container.states.tensor.tolist()}
    )


def test_a_buffer_emptied_by_max_use_continues_as_its_reloaded_copy(tmp_path, env):
    """Emptied by ``max_use``, a buffer takes the next push's layout, as its saved and reloaded copy (and a cleared
    buffer) does: the two hold the same items of the same dtypes after the same pushes."""
    cfg = dict(type='gfn', replay_buffer_size=4, max_use=1, seed=0)
    a = create_buffer(cfg)
    a.push(_states_of_dtype(env, 0, 2, torch.int64))
    assert a.sample(2) is not None and a.count() == 0
    a.save_data(str(tmp_path / 'drained.pt'))
    b = create_buffer(cfg)
    b.load_data(str(tmp_path / 'drained.pt'), env=env)
    for buf in (a, b):
        buf.push(_states_of_dtype(env, 10, 2, torch.int32))
    ca, cb = a.training_container, b.training_container
    assert ca.states.tensor.dtype == cb.states.tensor.dtype == torch.int32
    assert torch.equal(ca.states.tensor, cb.states.tensor) and torch.equal(ca.log_rewards, cb.log_rewards)
    assert a.stats()['unique_terminating_states'] == b.stats()['unique_terminating_states'] == 2


class _Box:
    """A minimal Container of the user's (not one of torchgfn's tensor-state classes): ids and log-rewards."""

    def __init__(self, ids, lr):
        self.ids, self._lr = ids, lr

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return _Box(self.ids[i].clone(), self._lr[i].clone())

    def extend(self, other):
        self.ids, self._lr = torch.cat([self.ids, other.ids]), torch.cat([self._lr, other._lr])

    log_rewards = property(lambda self: self._lr)
    terminating_states = property(lambda self: self.ids[:, None].float())


def test_a_buffer_of_user_containers_emptied_by_max_use_takes_the_next_push():
    """Emptied by ``max_use``, a buffer of containers that are not torchgfn's appends from the start again, as a
    cleared one does: the next pushes are stored and sampled (the append position had kept its old value)."""
    buf = create_buffer(dict(type='gfn', replay_buffer_size=4, max_use=1, seed=0))
    buf.push(_Box(torch.tensor([0, 1]), torch.zeros(2)))
    assert buf.sample(2) is not None and buf.count() == 0
    for k in range(3):
        assert buf.push(_Box(torch.tensor([10 * k, 10 * k + 1]), torch.full((2,), float(k)))) == 2
    assert buf.count() == 4 and sorted(buf.training_container.ids.tolist()) == [10, 11, 20, 21]
    assert sorted(buf.sample(4, replace=False).ids.tolist()) == [10, 11, 20, 21]


@pytest.mark.parametrize('how', ['clear', 'max_use', 'untracked'])
def test_a_buffer_and_its_reloaded_copy_take_the_same_next_push(env, how):
    """Cleared, emptied by ``max_use``, or no longer counting unique states (a non-terminating row came): the
    buffer and its own reloaded copy accept the same next push -- the width of the states it counted is not kept
    where the saved state does not keep it."""

    def sc(cond, term=(1, 1)):
        states = env.States(torch.tensor([[1, 2], [3, 4]]), conditions=cond)
        return StatesContainer(
            env=env, states=states, is_terminating=torch.tensor(term, dtype=torch.bool), log_rewards=torch.zeros(2)
        )

    a = create_buffer(dict(type='gfn', replay_buffer_size=8, seed=0, **({'max_use': 1} if how == 'max_use' else {})))
    if how == 'untracked':
        a.push(sc(None))
        a.push(sc(None, (1, 0)))
    else:
        a.push(sc(torch.zeros(2, 1)))  # conditional states: one more value per item
        a.clear() if how == 'clear' else a.sample(2)
    b = create_buffer(dict(type='gfn', replay_buffer_size=8, seed=0))
    b.load_state_dict(a.state_dict(), env=env)
    nxt = sc(torch.zeros(2, 1)) if how == 'untracked' else sc(None)
    assert a.push(nxt) == b.push(nxt) == 2
    assert_same(a.state_dict()['index'], b.state_dict()['index'])


def test_a_saved_track_states_that_is_no_bool_is_refused_at_load():
    a = create_buffer(dict(type='gfn_diverse', replay_buffer_size=4, seed=0))
    a.push({'state': torch.arange(8.0).reshape(4, 2), 'log_reward': torch.arange(4.0)})
    st = a.state_dict()
    b = create_buffer(dict(type='gfn_diverse', replay_buffer_size=4, seed=0))
    before = b.state_dict()
    for bad in (np.False_, 0, 1.0):
        with pytest.raises(ValueError, match="'track_states' must be None or a bool"):
            b.load_state_dict(dict(st, track_states=bad))
    assert_same(b.state_dict(), before)


def test_a_saved_container_with_inconsistent_tensors_is_refused_with_a_value_error(tmp_path, env):
    """A well-formed file whose container tensors disagree (3 items, 2 log-rewards): ``ValueError``, as for any
    mismatched file, and the buffer is unchanged (torchgfn's own check is a bare assert)."""
    a = create_buffer(dict(type='gfn', replay_buffer_size=8, seed=0))
    a.push(_states_of_dtype(env, 0, 3, torch.int64))
    st = a.state_dict()
    tensors = st['store']['tensors']
    tensors['log_rewards'] = tensors['log_rewards'][:2]
    b = create_buffer(dict(type='gfn', replay_buffer_size=8, seed=0))
    b.push(_states_of_dtype(env, 5, 2, torch.int64))
    before = b.state_dict()
    with pytest.raises(ValueError, match='StatesContainer'):
        b.load_state_dict(st, env=env)
    assert_same(b.state_dict(), before)


def test_samples_are_copies_with_the_pushed_values_whatever_the_field_dtypes(env):
    """A sample gathers fields numpy can view (int states, bool masks) and fields it cannot (bfloat16 log-rewards)
    alike: the pushed values, in new memory (changing a sample changes nothing stored), through a later push that
    widens a field."""
    buf = create_buffer(dict(type='gfn', replay_buffer_size=8, seed=0))
    states = torch.arange(4 * NDIM).reshape(4, NDIM) % HEIGHT
    first = terminal_states(env, states, torch.tensor([1.5, -2.0, 3.25, 0.5], dtype=torch.bfloat16))
    buf.push(first)
    got = buf.sample(4)
    assert got.log_rewards.dtype == torch.bfloat16 and got.states.tensor.dtype == torch.int64
    assert Counter(term_pairs(got)) == Counter(term_pairs(first))
    got.states.tensor.fill_(0)
    got.log_rewards.fill_(7)
    got.is_terminating.fill_(False)
    assert Counter(term_pairs(buf.sample(4))) == Counter(term_pairs(first))
    second = terminal_states(env, (states + 1) % HEIGHT, torch.tensor([0.25, 9.0, -1.0, 2.5], dtype=torch.float64))
    buf.push(second)
    got = buf.sample(8)
    assert got.log_rewards.dtype == torch.float64
    assert Counter(term_pairs(got)) == Counter(term_pairs(first)) + Counter(term_pairs(second))


class OtherTrajectories(Trajectories):
    """Not one of torchgfn's own classes: kept in the append-only container store."""


def test_the_terminating_states_of_backward_trajectories_are_where_they_start(samplers, env):
    """A backward trajectory starts at its terminating state (torchgfn's ``terminating_states`` property reads the
    state before ``terminating_idx``: a child of s0 there): ``terminating_state`` stores the start states with their
    rewards, and a ``gfn`` buffer counts them as its unique terminating states, the same after a reload."""
    torch.manual_seed(7)
    starts = [trajectories(samplers, env, 12).terminating_states for _ in range(3)]
    bwd = [samplers[1].sample_trajectories(env, states=x) for x in starts]
    assert all(b.is_backward and torch.equal(b.states.tensor[0], x.tensor) for b, x in zip(bwd, starts))
    truth = [tuple(r) for x in starts for r in x.tensor.tolist()]

    ts = create_buffer(dict(type='terminating_state', replay_buffer_size=100))
    for b in bwd:
        ts.push(b)
    held = ts.training_container
    assert sorted(map(tuple, held.states.tensor.tolist())) == sorted(truth)
    assert torch.equal(held.log_rewards, env.log_reward(held.states))

    buf = create_buffer(dict(type='gfn', replay_buffer_size=100, seed=0))
    for b in bwd:
        buf.push(b)
    again = create_buffer(dict(type='gfn', replay_buffer_size=100, seed=0))
    again.load_state_dict(buf.state_dict(), env=env)
    assert buf.stats()['unique_terminating_states'] == again.stats()['unique_terminating_states'] == len(set(truth))
    with pytest.raises(ValueError, match='backward Transitions'):  # no terminating state to tell: refused
        ts.push(bwd[0].to_transitions())
    assert ts.count() == len(truth)


@pytest.mark.parametrize('store', ['ring', 'append-only'])
@pytest.mark.parametrize('first', ['forward', 'backward'])
def test_a_buffer_holds_one_direction_of_trajectories(samplers, env, pool, first, store):
    """A sample is one container of one direction: trajectories of the other direction are refused with nothing
    changed (they were stored and came back marked with the first push's direction); an empty container of the
    other direction is a no-op; a cleared buffer takes either."""

    def kind(t):
        if store == 'ring':
            return t
        cols = dict(states=t.states, actions=t.actions, terminating_idx=t.terminating_idx, log_rewards=t._log_rewards)
        return OtherTrajectories(env=env, is_backward=t.is_backward, **cols)

    raw = trajectories(samplers, env, 4, pool.take(4))
    raw_bwd = samplers[1].sample_trajectories(env, states=trajectories(samplers, env, 4).terminating_states)
    fwd, bwd = kind(raw), kind(raw_bwd)
    assert bwd.is_backward and not fwd.is_backward
    held, other = (fwd, bwd) if first == 'forward' else (bwd, fwd)
    empty_other = kind((raw_bwd if first == 'forward' else raw)[torch.arange(0)])
    buf = create_buffer(dict(type='gfn', replay_buffer_size=8, seed=0))
    buf.push(held)
    before = buf.state_dict()
    with pytest.raises(ValueError, match=f'is_backward={other.is_backward}.*holds {first}'):
        buf.push(other)
    assert buf.push(empty_other) == 0  # (empty: nothing to join)
    assert_same(before, buf.state_dict())
    assert buf.sample(4).is_backward == held.is_backward
    buf.clear()
    buf.push(other)
    assert buf.sample(4).is_backward == other.is_backward


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
@pytest.mark.parametrize('btype', ['gfn', 'gfn_diverse', 'terminating_state'])
def test_containers_on_the_gpu_match_cpu_and_a_file_reloads_onto_the_env_device(btype, tmp_path):
    """Containers of an env on the GPU are stored, sampled and saved as a CPU twin's; a file loaded with that env
    rebuilds its container on the env's device (the saved CPU tensors failed torchgfn's device check)."""
    envs = {d: HyperGrid(ndim=3, height=HEIGHT, device=d) for d in ('cpu', 'cuda')}
    bufs = {d: create_buffer(dict(type=btype, replay_buffer_size=32, seed=1)) for d in envs}
    g = torch.Generator().manual_seed(0)
    for _ in range(10):
        x, r = torch.randint(0, HEIGHT, (8, 3), generator=g), torch.randn(8, generator=g)
        stored = set()
        for d, env in envs.items():
            c = StatesContainer(
                env=env,
                states=env.states_from_tensor(x.to(d)),
                is_terminating=torch.ones(8, dtype=torch.bool, device=d),
                log_rewards=r.to(d),
            )
            stored.add(bufs[d].push(c))
        assert len(stored) == 1
        a, b = bufs['cpu'].sample(4), bufs['cuda'].sample(4)
        assert b.states.tensor.device.type == 'cuda' and torch.equal(a.states.tensor, b.states.tensor.cpu())
    path = str(tmp_path / 'gpu.pt')
    bufs['cuda'].save_data(path)
    fresh = create_buffer(dict(type=btype, replay_buffer_size=32, seed=1))
    fresh.load_data(path, env=envs['cuda'])
    got, want = fresh.sample(4), bufs['cuda'].sample(4)
    assert got.states.tensor.device.type == 'cuda' and torch.equal(got.states.tensor, want.states.tensor)


# ---------------------------------------------------------------------------------------------- other envs' states
def _bit_sequence_trajectories(n=3):
    from gfn.gym.bitSequence import BitSequence

    torch.manual_seed(0)
    env = BitSequence(word_size=2, seq_size=8, n_modes=4)
    return env, _uniform_trajectories(env, n)


def _uniform_trajectories(env, n):
    from gfn.preprocessors import IdentityPreprocessor

    class Uniform(torch.nn.Module):
        def __init__(self, n):
            super().__init__()
            self.n, self.w = n, torch.nn.Parameter(torch.zeros(1))

        def forward(self, x):
            return torch.zeros(x.shape[:-1] + (self.n,)) + 0 * self.w

    width = env.state_shape[0]
    pf = DiscretePolicyEstimator(Uniform(env.n_actions), env.n_actions, preprocessor=IdentityPreprocessor(width))
    with torch.no_grad():
        return Sampler(pf).sample_trajectories(env, n=n)


@pytest.mark.parametrize('kind', ['gfn', 'gfn_diverse', 'terminating_state'])
def test_a_batch_the_stored_containers_extend_refuses_changes_nothing(kind):
    """BitSequence's containers are kept as pushed (their states have fields of their own): another env's
    trajectories of the same state width passed every check, then the stored container's ``extend`` raised halfway
    -- after evictions and counters had moved, and with the container left half extended (every later push failed)."""
    from gfn.gym import DiscreteEBM

    env, trajectories = _bit_sequence_trajectories(n=6)
    other = _uniform_trajectories(DiscreteEBM(ndim=4), 2)  # (4 int64 values per state, as BitSequence's words)
    buf = create_buffer(dict(type=kind, replay_buffer_size=3, seed=0))
    buf.add(trajectories[torch.arange(3)])
    before = buf.state_dict()
    with pytest.raises(ValueError, match="cannot join the stored .* items .*'length'"):
        buf.add(other)
    assert_same(buf.state_dict(), before)
    buf.add(trajectories[torch.arange(3, 6)])
    assert buf.count() == 3 and len(buf.sample(3)) == 3


@pytest.mark.parametrize('kind', ['Trajectories', 'Transitions'])
def test_states_with_fields_of_their_own_are_stored_as_pushed(kind):
    """BitSequence's states carry a ``length`` besides their tensor: the buffer gives back what was pushed (a
    ring rebuilt them from the tensor: the sink rows' length and forward masks differed)."""
    env, trajectories = _bit_sequence_trajectories()
    pushed = trajectories if kind == 'Trajectories' else trajectories.to_transitions()
    buf = create_buffer(dict(type='gfn', replay_buffer_size=20, seed=0))
    buf.add(pushed)
    attr = 'states' if kind == 'Trajectories' else 'next_states'
    mine, theirs = getattr(buf.training_container, attr), getattr(pushed, attr)
    assert torch.equal(mine.length, theirs.length) and torch.equal(mine.forward_masks, theirs.forward_masks)
    assert len(buf.sample(2)) == 2


def test_containers_of_graph_states_are_refused_naming_why():
    """Graph states are no tensor: a buffer could not save or reload them (torchgfn's to_tensordict / from_tensordict
    do not take them), so a push is refused clearly, with nothing changed (it raised from inside torch_geometric)."""
    from gfn.gym.graph_building import GraphBuilding

    env = GraphBuilding(
        num_node_classes=3, num_edge_classes=2, state_evaluator=lambda s: torch.ones(len(s)), max_nodes=4
    )
    torch.manual_seed(0)
    c = StatesContainer(
        env=env,
        states=env.make_random_states(3),
        is_terminating=torch.ones(3, dtype=torch.bool),
        log_rewards=torch.randn(3),
    )
    for kind in ('gfn', 'gfn_diverse', 'terminating_state'):
        buf = create_buffer(dict(type=kind, replay_buffer_size=5, seed=0))
        before = buf.state_dict()
        with pytest.raises(TypeError, match='graph states'):
            buf.add(c)
        assert_same(buf.state_dict(), before)


class NumpyStates:  # (a container of another library: its states are no torch tensor, rows in numpy)
    def __init__(self, arr):
        self.tensor = arr

    def __len__(self):
        return len(self.tensor)


class MyContainer:  # the Container protocol: __len__, __getitem__, extend, log_rewards, terminating_states
    log_rewards = None

    def __init__(self, arr, r):
        self.states, self.log_rewards = NumpyStates(arr), r

    def __len__(self):
        return len(self.log_rewards)

    def __getitem__(self, i):
        i = np.asarray(i)
        return MyContainer(self.states.tensor[i], self.log_rewards[torch.as_tensor(i)])

    def extend(self, other):
        self.states = NumpyStates(np.concatenate([self.states.tensor, other.states.tensor]))
        self.log_rewards = torch.cat([self.log_rewards, other.log_rewards])

    @property
    def terminating_states(self):
        return torch.as_tensor(self.states.tensor, dtype=torch.float32)


def test_a_container_of_another_library_with_states_of_its_own_is_taken():
    """The graph-state refusal is for torchgfn's containers (saved as tensors): other containers are kept as the
    pushed objects, whatever their states hold."""
    for kind in ('gfn', 'gfn_diverse'):
        buf = create_buffer(dict(type=kind, replay_buffer_size=5, seed=0))
        buf.add(MyContainer(np.arange(6.0).reshape(3, 2), torch.tensor([0.1, 0.2, 0.3])))
        assert buf.count() == 3 and len(buf.sample(2)) == 2


class MyStatesContainer(StatesContainer):  # (a user's subclass of a torchgfn container)
    pass


def test_a_subclass_of_a_torchgfn_container_is_a_torchgfn_container():
    """terminating_state turns it into a StatesContainer (it became a dict batch), and graph states in it are
    refused as in the base class (they were taken, and the buffer's state did not reload)."""
    from gfn.gym.graph_building import GraphBuilding

    env = HyperGrid(ndim=2, height=8)
    torch.manual_seed(0)
    c = MyStatesContainer(
        env=env,
        states=env.states_from_tensor(torch.randint(0, 8, (3, 2))),
        is_terminating=torch.ones(3, dtype=torch.bool),
        log_rewards=torch.randn(3),
    )
    buf = create_buffer(dict(type='terminating_state', replay_buffer_size=10, seed=0))
    buf.add(c)
    assert isinstance(buf.sample(2), StatesContainer)
    graphs = GraphBuilding(
        num_node_classes=3, num_edge_classes=2, state_evaluator=lambda s: torch.ones(len(s)), max_nodes=4
    )
    g = MyStatesContainer(
        env=graphs,
        states=graphs.make_random_states(3),
        is_terminating=torch.ones(3, dtype=torch.bool),
        log_rewards=torch.randn(3),
    )
    with pytest.raises(TypeError, match='graph states'):
        create_buffer(dict(type='gfn', replay_buffer_size=5, seed=0)).add(g)


@pytest.mark.parametrize('kind', ['gfn', 'gfn_diverse', 'terminating_state'])
def test_an_empty_container_of_another_kind_is_a_no_op(kind, env, samplers, pool):
    """The docs: an empty container is a no-op, whatever its kind (it raised 'this buffer holds Trajectories
    containers' on gfn and gfn_diverse)."""
    buf = create_buffer(dict(type=kind, replay_buffer_size=10, seed=0))
    buf.add(trajectories(samplers, env, 3, pool.take(3)))
    before = buf.state_dict()
    for empty in (Transitions(env), StatesContainer(env)):
        assert buf.push(empty) == 0
    assert_same(buf.state_dict(), before)


def test_a_batch_whose_conditions_differ_from_the_stored_ones_is_refused_saying_so():
    """The width of an item's representation counts its conditions: a batch without them after stored ones with
    them is refused naming conditions (the message gave two value counts), nothing stored."""
    small = HyperGrid(ndim=2, height=8)

    def two_step(conditions):
        st = torch.stack([small.s0.expand(2, 2), torch.tensor([1, 0]).expand(2, 2), small.sf.expand(2, 2)])
        states = small.States(st.clone())
        if conditions:
            states.conditions = torch.ones(3, 2, 2)
        actions = small.Actions(torch.tensor([[0, 0], [2, 2]]).unsqueeze(-1))
        return Trajectories(small, states=states, actions=actions, terminating_idx=torch.full((2,), 2))

    buf = create_buffer(dict(type='terminating_state', replay_buffer_size=10, seed=0))
    buf.add(two_step(True))
    with pytest.raises(ValueError, match='all with conditions of one width or all without'):
        buf.add(two_step(False))
    assert buf.count() == 2


def _conditioned(env, n, width, seed=0):
    """A StatesContainer of ``n`` terminating HyperGrid states with conditions of ``width`` (None: none)."""
    g = torch.Generator().manual_seed(seed)
    cond = None if width is None else torch.rand(n, width, generator=g)
    states = env.states_from_tensor(torch.randint(0, env.height, (n, env.ndim), generator=g), conditions=cond)
    return StatesContainer(
        env=env, states=states, is_terminating=torch.ones(n, dtype=torch.bool), log_rewards=torch.rand(n, generator=g)
    )


@pytest.mark.parametrize('btype', ['gfn', 'gfn_diverse', 'terminating_state'])
@pytest.mark.parametrize('emptied', ['clear', 'max_use', 'reload'])
def test_an_emptied_buffer_takes_states_of_another_layout(env, btype, emptied):
    """An emptied ring takes the layout of what comes (as torchgfn's extend does): after clear(), a max_use that used
    every item up, or a load of an empty state, a push of conditions of another width was refused against the
    tensors the old items had left ("the stored ones are (3,)"), though nothing was stored."""
    extra = dict(max_use=1) if emptied == 'max_use' else {}
    buf = create_buffer(dict(type=btype, replay_buffer_size=10, seed=0, **extra))
    buf.push(_conditioned(env, 4, 3))
    if emptied == 'clear':
        buf.clear()
    elif emptied == 'max_use':
        buf.sample(4)
    else:
        empty = create_buffer(dict(type=btype, replay_buffer_size=10, seed=0))
        empty.push(_conditioned(env, 4, 3))
        empty.clear()
        buf = create_buffer(dict(type=btype, replay_buffer_size=10, seed=0))
        buf.load_state_dict(empty.state_dict(), env=env)
    assert buf.count() == 0
    assert buf.push(_conditioned(env, 4, 2, seed=1)) == 4
    state = buf.state_dict()
    assert buf.sample(4).states.conditions.shape == (4, 2)
    again = create_buffer(dict(type=btype, replay_buffer_size=10, seed=0))
    again.load_state_dict(state, env=env)
    assert again.sample(4).states.conditions.shape == (4, 2)
    buf.push(_conditioned(env, 4, 2, seed=2))
    with pytest.raises(ValueError, match=r"conditions holds items of shape \(3,\)"):  # a stored layout still holds
        buf.push(_conditioned(env, 4, 3))


def _under_default(dtype, make):
    """``make()`` with torch's default dtype set to ``dtype`` (restored after)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return make()
    finally:
        torch.set_default_dtype(old)


@pytest.mark.parametrize('btype', ['gfn', 'gfn_diverse', 'terminating_state'])
def test_conditions_follow_torchgfns_default_dtype_rule_at_push_and_stay_readable_after(env, btype, tmp_path):
    """torchgfn's states take conditions of torch's default dtype (its buffers refuse others at add). float64
    conditions pushed into a float32 program were accepted, then every sample, state_dict and save_data raised a bare
    AssertionError (the states were rebuilt by the validating constructor). Refused at push now, nothing changed; and
    stored conditions stay readable after the program changes its default dtype, as torchgfn's indexing keeps them."""
    buf = create_buffer(dict(type=btype, replay_buffer_size=10, seed=0))
    buf.push(_conditioned(env, 4, 3))
    before = buf.state_dict()
    wide = _under_default(torch.float64, lambda: _conditioned(env, 4, 3, seed=1))
    with pytest.raises(ValueError, match=r"conditions has dtype torch.float64.*default dtype \(torch.float32 now\)"):
        buf.push(wide)
    assert_same(buf.state_dict(), before)
    pushed = buf.training_container.states.conditions.clone()
    state = _under_default(torch.float64, buf.state_dict)
    got = _under_default(torch.float64, lambda: buf.sample(4))
    assert got.states.conditions.dtype == torch.float32
    assert sorted(map(tuple, got.states.conditions.tolist())) == sorted(map(tuple, pushed.tolist()))
    _under_default(torch.float64, lambda: buf.save_data(str(tmp_path / 'b.pt')))
    again = create_buffer(dict(type=btype, replay_buffer_size=10, seed=0))
    with pytest.raises(ValueError, match=r"states_conditions of dtype torch.float32.*set_default_dtype\(torch.float32"):
        _under_default(torch.float64, lambda: again.load_state_dict(state, env=env))  # torchgfn could not build them
    assert again.count() == 0
    again.load_state_dict(state, env=env)
    assert torch.equal(again.training_container.states.conditions, pushed)


def test_conditions_of_containers_kept_whole_follow_the_same_rule(tmp_path):
    """States with fields of their own (BitSequence's) are kept in their container and read by torchgfn's own
    indexing: a push of conditions not of the default dtype raised a bare AssertionError, and so did every read once
    the program changed its default. Both are ValueErrors naming the field and the dtypes, nothing changed."""
    from gfn.gym import BitSequence

    bits = BitSequence(word_size=2, seq_size=8, n_modes=2)

    def container(seed):
        g = torch.Generator().manual_seed(seed)
        states = bits.states_from_tensor(torch.randint(0, 4, (4, 4), generator=g))
        states.conditions = torch.rand(4, 3, generator=g)
        terminating = torch.ones(4, dtype=torch.bool)
        return StatesContainer(env=bits, states=states, is_terminating=terminating, log_rewards=torch.rand(4))

    buf = create_buffer(dict(type='gfn', replay_buffer_size=10, seed=0))
    buf.push(container(0))
    before = buf.state_dict()
    with pytest.raises(ValueError, match=r"states.conditions has dtype torch.float64.*\(torch.float32 now\)"):
        buf.push(_under_default(torch.float64, lambda: container(1)))
    assert_same(buf.state_dict(), before)
    with pytest.raises(ValueError, match=r"conditions has dtype torch.float32.*set that default back"):
        _under_default(torch.float64, lambda: buf.sample(2))
    assert_same(buf.state_dict(), before)
    assert buf.sample(2).states.conditions.dtype == torch.float32


def test_a_load_with_an_env_of_another_action_shape_is_refused_by_name():
    """Box trajectories and HyperGrid(ndim=2)'s have states of one shape but actions of two: a load with the other
    env was accepted one way (samples of actions the env does not take, its own trajectories refused after) and
    refused the other with torch's broadcast error. Both are refused naming the shapes, the buffer unchanged."""
    from gfn.gym import BoxCartesian
    from gfn.gym.helpers.box_cartesian_utils import BoxCartesianPFEstimator, BoxCartesianPFMLP
    from gfn.preprocessors import IdentityPreprocessor

    torch.manual_seed(0)
    box, grid = BoxCartesian(delta=0.25), HyperGrid(ndim=2, height=8)
    box_pf = BoxCartesianPFEstimator(box, BoxCartesianPFMLP(hidden_dim=16, n_hidden_layers=1, n_components=2), 2)
    grid_pf = DiscretePolicyEstimator(
        MLP(2, grid.n_actions, hidden_dim=16, n_hidden_layers=1), grid.n_actions, preprocessor=IdentityPreprocessor(2)
    )
    for env, pf, other in ((box, box_pf, grid), (grid, grid_pf, box)):
        saved = create_buffer(dict(type='gfn', replay_buffer_size=8, seed=0))
        saved.add(Sampler(pf).sample_trajectories(env, n=3))
        target = create_buffer(dict(type='gfn', replay_buffer_size=8, seed=0))
        before = target.state_dict()
        with pytest.raises(ValueError, match=r'holds actions of shape \(\d,\), but the env passed to load has action_'):
            target.load_state_dict(saved.state_dict(), env=other)
        assert_same(target.state_dict(), before)
        target.load_state_dict(saved.state_dict(), env=env)
        assert target.count() == 3 and target.sample(2).actions.tensor.shape[-1:] == env.action_shape
