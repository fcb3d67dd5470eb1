"""Sharded buffers (``distributed.num_shards``): sampling across shards equals one buffer holding every item (chi-square
against the exact probabilities), IS weights against the global minimum, update routing, hash routing, state round
trips that are all or nothing, and K Ray actors with one of them killed."""

import os
import sys
import time
import types
import uuid

import numpy as np
import pytest
import torch
from helpers import assert_same
from scipy import stats as sstats

from ding_buffer import SampleTimeoutError, create_buffer
from ding_buffer.distributed.sharded import ShardedBuffer
from ding_buffer.errors import ManagerUnavailableError

ALPHA, BETA = 0.6, 0.4


def adv_cfg(seed=0, **kw):
    return dict(
        type='advanced',
        replay_buffer_size=200,
        alpha=ALPHA,
        beta=BETA,
        anneal_step=1000,
        seed=seed,
        storage=dict(type='tensor'),
        **kw,
    )


def local_sharded(kind, k=3, seed=0, **route):
    cfg = adv_cfg() if kind == 'advanced' else dict(type='naive', replay_buffer_size=200, storage=dict(type='tensor'))
    shards = [create_buffer(dict(cfg, seed=100 + i)) for i in range(k)]
    return ShardedBuffer(shards, cfg, seed=seed, **route), cfg


def item(i, priority=None):
    out = {'obs': torch.tensor([float(i)]), 'env': i % 5}
    if priority is not None:
        out['priority'] = float(priority)
    return out


def frequencies(buf, n_items, draws, batch):
    seen = np.zeros(n_items)
    for _ in range(draws):
        b = buf.sample(batch)
        np.add.at(seen, b['obs'][:, 0].long().numpy(), 1)
    return seen


def test_prioritized_sampling_across_shards_matches_one_buffer_by_chi_square():
    buf, _ = local_sharded('advanced', k=3)
    n = 60
    prio = np.array([1 + (i % 7) for i in range(n)], dtype=float)
    for i in range(n):  # round-robin: the shards hold different items with different priority masses
        buf.push(item(i, prio[i]))
    assert [s.count() for s in buf.shards] == [20, 20, 20]
    seen = frequencies(buf, n, 600, 32)
    expected = prio**ALPHA / (prio**ALPHA).sum() * seen.sum()
    assert sstats.chisquare(seen, expected).pvalue > 1e-3
    # one buffer with the same items: its empirical distribution agrees with the sharded one (two-sample test)
    single = create_buffer(adv_cfg(seed=7))
    for i in range(n):
        single.push(item(i, prio[i]))
    one = frequencies(single, n, 600, 32)
    assert sstats.chi2_contingency(np.stack([seen, one])).pvalue > 1e-3


def test_is_weights_use_the_global_minimum_and_one_buffers_beta_schedule():
    buf, _ = local_sharded('advanced', k=2)
    prio = {0: 1.0, 1: 4.0, 2: 9.0, 3: 16.0}
    for i, p in prio.items():  # shard 0 gets 0 and 2, shard 1 gets 1 and 3: the global minimum lives on shard 0
        buf.push(item(i, p))
    single = create_buffer(adv_cfg(seed=3))
    for i, p in prio.items():
        single.push(item(i, p))
    for call in range(5):
        beta = buf.beta
        assert beta == pytest.approx(single.beta)
        b = buf.sample(4)  # one buffer samples at most its count per call (sample_min_limit_ratio=1): so do shards
        ref = single.sample(4)
        leaf = torch.tensor([prio[int(x)] for x in b['obs'][:, 0]], dtype=torch.float64) ** ALPHA
        torch.testing.assert_close(b['IS'].double(), (leaf / 1.0) ** -beta, rtol=1e-5, atol=0)
        ref_leaf = torch.tensor([prio[int(x)] for x in ref['obs'][:, 0]], dtype=torch.float64) ** ALPHA
        torch.testing.assert_close(ref['IS'].double(), ref_leaf**-beta, rtol=1e-5, atol=0)  # the same rule
    assert buf.beta == pytest.approx(single.beta)


def test_update_goes_to_the_owning_shard_and_moves_the_distribution():
    buf, _ = local_sharded('advanced', k=3)
    for i in range(30):
        buf.push(item(i, 1.0))
    b = buf.sample(30)
    hot = b['obs'][:, 0] == b['obs'][0, 0]  # make one item (on whatever shard) 50x more likely
    res = buf.update(
        {
            'shard': b['shard'],
            'replay_unique_id': b['replay_unique_id'],
            'replay_buffer_idx': b['replay_buffer_idx'],
            'priority': torch.where(hot, 50.0 ** (1 / ALPHA), 1.0),
        }
    )
    assert res == {'updated': 30, 'stale': 0}
    seen = frequencies(buf, 30, 400, 30)
    target = int(b['obs'][0, 0])
    expected = np.ones(30)
    expected[target] = 50.0
    expected *= seen.sum() / expected.sum()
    assert sstats.chisquare(seen, expected).pvalue > 1e-3
    with pytest.raises(ValueError, match="'shard' column"):
        buf.update({'replay_unique_id': b['replay_unique_id'], 'priority': torch.ones(30)})


def test_an_update_with_a_bad_priority_in_a_later_shards_rows_changes_no_shard():
    """The priorities are checked whole before any shard is asked: a NaN among a later shard's rows changed the
    shards before it, and named the entry by its place in that shard's part."""
    buf, _ = local_sharded('advanced', k=3)
    for i in range(30):
        buf.push(item(i, 1.0))
    b = buf.sample(30)
    order = torch.argsort(b['shard'], stable=True)
    priority = torch.full((30,), 2.0)
    priority[order[-1]] = float('nan')  # a row of the last shard asked
    before = buf.state_dict()
    info = dict(shard=b['shard'], replay_unique_id=b['replay_unique_id'], replay_buffer_idx=b['replay_buffer_idx'])
    with pytest.raises(ValueError, match=f"entry {int(order[-1])} is nan"):
        buf.update(dict(info, priority=priority))
    assert_same(buf.state_dict(), before)


def test_uniform_without_replacement_across_shards_is_uniform_and_distinct():
    buf, _ = local_sharded('naive', k=3)
    for i in range(45):
        buf.push([item(i)] if i % 2 else item(i))
    for s in buf.shards:
        assert s.count() == 15
    seen = np.zeros(45)
    for _ in range(400):
        b = buf.sample(20)
        ids = b['obs'][:, 0].long().numpy()
        assert len(set(ids.tolist())) == 20  # distinct, as one buffer's draw without replacement
        np.add.at(seen, ids, 1)
    assert sstats.chisquare(seen).pvalue > 1e-3
    assert buf.sample(46) is None  # more than all shards hold together
    b = buf.sample(50, replace=True)
    assert len(b['obs']) == 50


def gfn_sharded(k=3, **cfg):
    base = dict(type='gfn', replay_buffer_size=100, **cfg)
    return ShardedBuffer([create_buffer(dict(base, seed=10 + i)) for i in range(k)], base, seed=1)


def test_gfn_softmax_sampling_across_shards_matches_one_buffer_by_chi_square():
    buf = gfn_sharded(prioritized_sampling=True, sample_replacement=True)
    rng = np.random.default_rng(0)
    n = 45
    log_r = rng.normal(0, 1, n)
    for start in range(0, n, 5):  # batches of 5, round-robin: three shards of 15 with different reward masses
        buf.push(
            {
                'state': torch.arange(start, start + 5).float().unsqueeze(1),
                'log_reward': torch.tensor(log_r[start : start + 5]),
            }
        )
    seen = np.zeros(n)
    for _ in range(300):
        b = buf.sample(64)
        np.add.at(seen, b['state'][:, 0].long().numpy(), 1)
    p = np.exp(log_r - log_r.max())
    assert sstats.chisquare(seen, p / p.sum() * seen.sum()).pvalue > 1e-3
    other = gfn_sharded(prioritized_sampling=True)
    other.push({'state': torch.zeros(5, 1), 'log_reward': torch.zeros(5)})
    with pytest.raises(ValueError, match='draws with replacement'):
        other.sample(4)  # Gumbel-top-k without replacement does not split into per-shard draws


def test_gfn_uniform_sampling_across_shards_without_replacement():
    buf = gfn_sharded()
    for start in range(0, 30, 5):
        buf.push({'state': torch.arange(start, start + 5).float().unsqueeze(1), 'log_reward': torch.zeros(5)})
    seen = np.zeros(30)
    for _ in range(300):
        b = buf.sample(12)  # the default rule: without replacement while the shards hold enough
        ids = b['state'][:, 0].long().numpy()
        assert len(set(ids.tolist())) == 12
        np.add.at(seen, ids, 1)
    assert sstats.chisquare(seen).pvalue > 1e-3
    assert len(buf.sample(40)['state']) == 40  # more than all hold: with replacement, as one gfn buffer does


def test_hash_routing_keeps_a_key_on_one_shard():
    buf, _ = local_sharded('naive', k=3, route='hash', shard_key='env')
    buf.push([item(i) for i in range(40)])
    buf.extend({'obs': torch.arange(40, 60).float().unsqueeze(1), 'env': torch.arange(40, 60) % 5})
    import zlib

    want = [0] * 3
    for i in range(60):
        want[zlib.crc32(repr(i % 5).encode()) % 3] += 1
    assert [s.count() for s in buf.shards] == want
    for s in buf.shards:  # every env lives on exactly one shard
        envs = set(s.sample(s.count())['env'].tolist()) if s.count() else set()
        assert all(zlib.crc32(repr(e).encode()) % 3 == buf.shards.index(s) for e in envs)
    with pytest.raises(ValueError, match="no field 'env'"):
        buf.push({'obs': torch.zeros(1)})


def test_a_key_routes_alike_as_an_int_a_numpy_int_and_a_tensor():
    """Hash routing took the repr of a numpy scalar ('np.int64(3)'), so one environment's steps pushed as ints and
    as a numpy column went to different shards."""
    buf, _ = local_sharded('naive', k=3, route='hash', shard_key='env')
    for env in (3, np.int64(3), torch.tensor(3)):
        buf.push({'obs': torch.zeros(1), 'env': env})
    buf.extend({'obs': torch.zeros(2, 1), 'env': np.array([3, 3])})
    assert sorted(s.count() for s in buf.shards) == [0, 0, 5]


class _FrozenShard:
    """A shard whose manager does not answer in time, as a RemoteBuffer reports it; then it answers again."""

    def __init__(self):
        from ding_buffer.errors import ManagerTimeoutError

        self.frozen, self.error, self.pushed, self.raised = True, ManagerTimeoutError, [], None
        self.pushes = self  # (as a RemoteBuffer's push pipeline: it tells the retry of the push that raised)

    def is_retry(self, data, batched):
        return data is self.raised

    def push(self, data, *args, **kwargs):
        if self.frozen:
            self.raised = data
            raise self.error("manager rank 3 did not answer 'push' within 2.0s (distributed.timeout)")
        self.pushed.append(data)
        return 1

    def state_dict(self):
        return {'pushed': len(self.pushed)}

    def load_state_dict(self, state, deepcopy=False):
        del self.pushed[state['pushed'] :]


def test_a_shards_timeout_keeps_its_class_and_a_retry_goes_to_the_same_shard():
    """A frozen shard's ManagerTimeoutError came back as a plain ManagerUnavailableError, and round-robin moved
    on before the push: the documented retry loop sent the push in doubt to the next shard, storing it twice once
    the frozen one woke. A refused push moved the routing position too (state_dict changed)."""
    from ding_buffer.errors import ManagerTimeoutError

    cfg = dict(type='naive', replay_buffer_size=100, storage=dict(type='tensor'))
    local = ShardedBuffer([create_buffer(dict(cfg, seed=k)) for k in range(2)], cfg, seed=0)
    local.push({'obs': torch.zeros(1)})
    local.push({'obs': torch.zeros(1)})
    before = local.state_dict()
    with pytest.raises(ValueError):
        local.push({'obs': torch.zeros(3)})  # shard 0 refuses its shape
    assert_same(local.state_dict(), before)

    frozen = _FrozenShard()
    buf = ShardedBuffer([create_buffer(dict(cfg, seed=0)), frozen], cfg, seed=0)
    buf.push({'obs': torch.zeros(1)})  # shard 0
    x = {'obs': torch.ones(1)}
    with pytest.raises(ManagerTimeoutError, match='shard 1 of 2 is unavailable'):
        buf.push(x)
    assert buf.push({'obs': torch.full((1,), 2.0)}) == 1  # a new push goes on to the next shard (0)
    assert buf.shards[0].count() == 2
    with pytest.raises(ManagerTimeoutError):
        buf.push(x)  # round-robin: shard 1 again, still frozen
    frozen.frozen = False
    assert buf.push(x) == 1 and frozen.pushed == [x]  # the retry: the same shard, never shard 0
    assert buf.shards[0].count() == 2 and buf.state_dict()['next'] == 0


def test_a_loaded_state_routes_as_it_says_after_a_push_in_doubt():
    """A push in doubt outlived load_state_dict: the next push went to the shard after the doubted one, not to the
    routing position the state holds."""
    from ding_buffer.errors import ManagerTimeoutError

    cfg = dict(type='naive', replay_buffer_size=100, storage=dict(type='tensor'))

    def make():
        return ShardedBuffer([create_buffer(dict(cfg, seed=0)), _FrozenShard()], cfg, seed=0)

    buf, ref = make(), make()
    state = buf.state_dict()
    buf.push({'obs': torch.zeros(1)})
    with pytest.raises(ManagerTimeoutError):
        buf.push({'obs': torch.ones(1)})
    for b in (buf, ref):
        b.shards[1].frozen = False
        b.load_state_dict(state)
        b.push({'obs': torch.full((1,), 5.0)})
    assert [buf.shards[0].count(), len(buf.shards[1].pushed)] == [ref.shards[0].count(), len(ref.shards[1].pushed)]


def test_a_gfn_dict_batch_is_split_by_the_hash_key():
    """A gfn buffer takes a dict as a batch; hash routing took it as one item keyed by the whole column."""
    cfg = dict(type='gfn', replay_buffer_size=100)
    batch = {'state': torch.arange(12.0).reshape(6, 2), 'log_reward': torch.zeros(6), 'env': torch.arange(6) % 3}
    buf = ShardedBuffer([create_buffer(dict(cfg, seed=i)) for i in range(3)], cfg, route='hash', shard_key='env')
    assert buf.push(batch) == 6
    owner = {}
    for k, shard in enumerate(buf.shards):
        for env in shard.sample(shard.count())['env'].tolist() if shard.count() else ():
            assert owner.setdefault(env, k) == k  # every env on one shard
    assert sorted(owner) == [0, 1, 2]
    before = buf.state_dict()
    nested = dict(batch, extra={'a': torch.zeros(6, 2), 'b': torch.zeros(4)})  # leaves of two lengths
    for bad in (dict(batch, env=torch.arange(4) % 3), {k: v[:0] for k, v in batch.items()}, nested):
        with pytest.raises(ValueError, match='one leading dimension > 0'):
            buf.push(bad)  # a key column shorter than the batch (its rows were dropped), an empty batch
    assert_same(buf.state_dict(), before)


def test_a_sample_with_a_bad_learner_iteration_changes_nothing():
    buf, _ = local_sharded('advanced', k=2)
    buf.push([item(i, priority=1.0) for i in range(8)])
    before = buf.state_dict()
    with pytest.raises(TypeError, match='cur_learner_iter'):
        buf.sample(4, cur_learner_iter=1.5)
    assert_same(buf.state_dict(), before)


def test_state_round_trip_and_all_or_nothing_load():
    buf, cfg = local_sharded('advanced', k=3, seed=5)
    for i in range(30):
        buf.push(item(i, 1 + i % 4))
    buf.sample(8)
    state = buf.state_dict()
    expected = buf.sample(16)
    other, _ = local_sharded('advanced', k=3, seed=99)
    other.load_state_dict(state)
    got = other.sample(16)
    assert torch.equal(got['obs'], expected['obs']) and torch.equal(got['IS'], expected['IS'])
    broken = dict(state, shards=[state['shards'][0], state['shards'][1], {'type': 'NaiveReplayBuffer'}])
    fresh, _ = local_sharded('advanced', k=3)
    fresh.push(item(0, 2.0))
    before = [s.state_dict() for s in fresh.shards]
    with pytest.raises(ValueError):
        fresh.load_state_dict(broken)
    for a, s in zip(before, fresh.shards):  # shards 0 and 1 were put back
        assert_same(s.state_dict(), a)
    with pytest.raises(ValueError, match='holds 3 shards'):
        local_sharded('advanced', k=2)[0].load_state_dict(state)


@pytest.mark.parametrize('kind', [str, os.fsencode])
def test_save_data_of_local_shards_resumes_exactly(kind, tmp_path):
    """save_data wrote only the shards' files: a load_data went back to the first shard of the round-robin, beta's
    start and a fresh RNG, so the next push and sample differed from the saved buffer's. The client's part is saved
    next to the shards (path.client); a load continues exactly, as a load_state_dict does."""
    buf, _ = local_sharded('advanced', k=3, seed=5)
    for i in range(10):
        buf.push(item(i, 1 + i % 4))
    buf.sample(4)
    path = kind(tmp_path / 'ck.pt')  # (a bytes path: the same files, as open would name them)
    buf.save_data(path)
    assert sorted(os.listdir(tmp_path)) == ['ck.pt.client', 'ck.pt.shard0', 'ck.pt.shard1', 'ck.pt.shard2']
    other, _ = local_sharded('advanced', k=3, seed=99)
    other.load_data(path)
    for b in (buf, other):
        b.push(item(10, 3.0))
    assert [s.count() for s in other.shards] == [s.count() for s in buf.shards]
    got, expected = other.sample(6), buf.sample(6)
    assert torch.equal(got['obs'], expected['obs']) and torch.equal(got['IS'], expected['IS'])


def test_a_sharded_state_with_an_out_of_range_rng_is_refused_naming_it():
    buf, _ = local_sharded('advanced', k=2, seed=5)
    state = buf.state_dict()
    state['rng']['state']['inc'] = -1  # (numpy 1.x would wrap it; numpy 2 raised a bare OverflowError)
    fresh, _ = local_sharded('advanced', k=2)
    before = fresh.state_dict()
    with pytest.raises(ValueError, match="'rng'"):
        fresh.load_state_dict(state)
    assert_same(fresh.state_dict(), before)


def test_a_sharded_state_is_checked_key_by_key_and_a_refusal_changes_nothing():
    buf, _ = local_sharded('advanced', k=3, seed=5)
    for i in range(10):
        buf.push(item(i, 1 + i % 4))
    state = buf.state_dict()
    fresh, _ = local_sharded('advanced', k=3)
    before = fresh.state_dict()
    for bad, match in (
        (dict(state, nxet=1), r"unknown key\(s\) \['nxet'\]"),
        (dict(state, next=1.7), "state key 'next' is 1.7"),
        (dict(state, next=True), "state key 'next' is True"),
        ({k: v for k, v in state.items() if k != 'beta'}, r"lacks key\(s\) \['beta'\]"),
        (dict(state, beta='0.4'), "state key 'beta'"),
        (dict(state, rng={'bit_generator': 'MT19937'}), "state key 'rng'"),
        (dict(state, shards=state['shards'][0]), "state key 'shards'"),
    ):
        with pytest.raises(ValueError, match=match):
            fresh.load_state_dict(bad)
        assert_same(fresh.state_dict(), before)


def test_bad_sharding_config_names_the_key():
    with pytest.raises(ValueError, match='num_shards'):
        create_buffer(dict(type='naive', distributed=dict(backend='ray', num_shards=0)))
    with pytest.raises(ValueError, match="'distributed.local_buffer' do not combine"):
        create_buffer(dict(type='naive', distributed=dict(backend='torch', num_shards=2, local_buffer=True)))
    with pytest.raises(ValueError, match="works with types"):
        ShardedBuffer.check(dict(type='episode'))
    with pytest.raises(ValueError, match='shard_key'):
        ShardedBuffer.check(dict(type='naive'), route='hash')
    # another sampler's draw does not split by sizes or masses (advanced drew by priority and rewrote IS)
    for kind, sampler in (('advanced', 'uniform'), ('naive', 'column_weighted')):
        with pytest.raises(ValueError, match=f"config key 'sampler' \\('{sampler}'\\) with distributed.num_shards"):
            ShardedBuffer.check(dict(type=kind, sampler=dict(type=sampler)))
    for kind, sampler in (('advanced', {}), ('advanced', dict(type='prioritized')), ('naive', dict(type='uniform'))):
        ShardedBuffer.check(dict(type=kind, sampler=sampler))  # (uniform draws split by the shards' sizes)


@pytest.mark.parametrize(
    'frames, route, key',
    [(dict(env_key='env'), 'round_robin', None), (dict(env_key='env'), 'hash', 'step'), (dict(), 'hash', 'env')],
)
def test_sharded_frames_need_each_environment_on_one_shard(frames, route, key):
    """A shard stores its own streams: storage.frames over shards is refused unless steps are routed by their
    environment (shard_route='hash', shard_key = storage.frames.env_key), which is accepted."""
    cfg = dict(type='advanced', storage=dict(type='tensor', frames=frames))
    with pytest.raises(ValueError, match='storage.frames.*shard_route'):
        ShardedBuffer.check(cfg, route=route, shard_key=key)
    ShardedBuffer.check(dict(cfg, storage=dict(type='tensor', frames=dict(env_key='env'))), 'hash', 'env')


# ---------------------------------------------------------------------------------------------------------- Ray
@pytest.fixture(scope='module')
def ray_session():
    ray = pytest.importorskip('ray')
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_ray_managers_serve_one_buffer_and_a_killed_shard_fails_only_what_needs_it(ray_session, tmp_path):
    ray = ray_session
    name = f'test_sharded_{uuid.uuid4().hex[:10]}'
    dist = dict(
        backend='ray',
        actor_name=name,
        namespace='ding_buffer_test',
        num_shards=2,
        timeout=10,
        startup_timeout=60,
        file_root=str(tmp_path),
        checkpoint_path=str(tmp_path / 'end.pt'),
        num_workers=2,
    )
    cfg = adv_cfg(distributed=dist)
    learner, actor = create_buffer(cfg), create_buffer(cfg)
    try:
        for i in range(20):
            actor.push(item(i, 1 + i % 3))
        assert learner.count() == 20 and [s.count() for s in learner.shards] == [10, 10]
        b = learner.sample(16)
        assert set(b['shard'].tolist()) <= {0, 1} and b['obs'].shape == (16, 1)
        assert (
            learner.update(
                {
                    'shard': b['shard'],
                    'replay_unique_id': b['replay_unique_id'],
                    'replay_buffer_idx': b['replay_buffer_idx'],
                    'priority': torch.ones(16),
                }
            )['updated']
            == 16
        )
        written = learner.save_data('ckpt.pt')
        assert [os.path.basename(p) for p in written] == ['ckpt.pt.shard0', 'ckpt.pt.shard1']
        for i in range(6):
            actor.push(item(50 + i, 1.0))
        assert learner.count() == 26
        learner.load_data('ckpt.pt')  # every shard back to its saved state: the checkpoint round-trips
        assert learner.count() == 20 and [s.count() for s in learner.shards] == [10, 10]
        back = learner.sample(20)
        assert set(back['obs'][:, 0].long().tolist()) <= set(range(20))
        st = learner.stats()
        assert st['count'] == 20 and st['shard0/count'] == st['shard1/count'] == 10

        ray.kill(ray.get_actor(f'{name}-shard1', namespace='ding_buffer_test'), no_restart=True)
        with pytest.raises(ManagerUnavailableError, match='shard 1 of 2'):
            learner.sample(8)
        assert learner.shards[0].count() == 10  # the other shard still serves
        outcomes = []
        for i in range(2):  # round-robin: one of the next two pushes reaches the dead shard
            try:
                actor.push(item(100 + i, 1.0))
                outcomes.append('ok')
            except ManagerUnavailableError as e:
                outcomes.append('shard 1' if 'shard 1 of 2' in str(e) else str(e))
        assert sorted(outcomes) == ['ok', 'shard 1']
        for client in (learner, actor):  # the live shard's client closes; the dead one is reported by name
            with pytest.raises(ManagerUnavailableError, match='closing shard 1 of 2 failed'):
                client.close(timeout=5.0)
        # both clients left: the live shard's actor writes its own checkpoint, checkpoint_path.shard0
        deadline = time.monotonic() + 30
        while not (tmp_path / 'end.pt.shard0').exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (tmp_path / 'end.pt.shard0').exists() and not (tmp_path / 'end.pt').exists()
    finally:
        for b in (learner, actor):
            try:
                b.close(timeout=5.0)
            except Exception:
                pass
        for k in range(2):
            try:
                ray.kill(ray.get_actor(f'{name}-shard{k}', namespace='ding_buffer_test'), no_restart=True)
            except ValueError:
                pass


if __name__ == '__main__':  # pragma: no cover
    sys.exit(pytest.main([__file__, '-q']))


def test_a_shard_reporting_nonsense_is_named_and_nothing_is_drawn():
    class Lying:
        def __init__(self, stats):
            self._stats = stats

        def stats(self):
            return self._stats

        def sample(self, *a, **kw):  # pragma: no cover - must not be reached
            raise AssertionError('drawn from a lying shard')

    good = create_buffer(adv_cfg(seed=1))
    good.push(item(0, 1.0))
    for lie in (
        {'count': 3, 'priority_mass': float('nan')},
        {'count': -2, 'priority_mass': 1.0},
        {'count': 3, 'priority_mass': float('inf')},
    ):
        buf = ShardedBuffer([good, Lying(lie)], adv_cfg(), seed=0)
        with pytest.raises(ValueError, match='shard 1 of 2 reports'):
            buf.sample(2)
    assert good.stats()['sample_calls'] == 0


def test_sample_timeout_waits_for_enough_items_then_draws():
    """``sample(n, timeout=t)``, as a RemoteBuffer takes it: None-free, it waits while the shards hold too few
    items (a pusher thread fills them meanwhile) and then returns a batch of n distinct items."""
    import threading

    buf, _ = local_sharded('naive', k=2)
    for i in range(3):
        buf.push(item(i))
    assert buf.sample(8) is None  # without a timeout: None at once, as before
    filler = threading.Timer(0.3, lambda: [buf.push(item(i)) for i in range(3, 12)])
    filler.start()
    t0 = time.monotonic()
    batch = buf.sample(8, timeout=10)
    waited = time.monotonic() - t0
    filler.join()
    assert waited > 0.2, waited  # it waited for the filler (a timeout would have raised SampleTimeoutError)
    got = batch['obs'][:, 0].long().tolist()
    assert len(got) == 8 and len(set(got)) == 8 and set(got) <= set(range(12))


def test_sample_timeout_raises_after_the_timeout_and_changes_nothing():
    from ding_buffer.errors import SampleTimeoutError

    buf, _ = local_sharded('advanced', k=2)
    for i in range(3):
        buf.push(item(i, 1.0))
    before = [s.state_dict() for s in buf.shards]
    t0 = time.monotonic()
    with pytest.raises(SampleTimeoutError, match='8 items within 0.3s'):
        buf.sample(8, timeout=0.3)
    assert 0.3 <= time.monotonic() - t0 < 30  # it waited its timeout (the outer bound only says it ended)
    for s, b in zip(buf.shards, before):
        assert_same(s.state_dict(), b)


@pytest.mark.parametrize('bad', [float('nan'), float('inf'), -1, 'x', True])
def test_sample_timeout_is_checked_before_anything_is_asked(bad):
    buf, _ = local_sharded('naive', k=2)
    buf.push(item(0))
    with pytest.raises(ValueError, match='timeout must be None or a number of seconds'):
        buf.sample(1, timeout=bad)


@pytest.mark.parametrize('kind', ['naive', 'advanced'])
def test_why_not_sample_answers_as_sample_draws_and_moves_nothing(kind):
    """``why_not_sample`` says why ``sample`` would return None (too few items across the shards; the priority mass
    of a prioritized buffer) or '' when it draws; it draws nothing, so the next sample equals an untouched twin's;
    ``timeout`` waits for '' and raises ``SampleTimeoutError`` after it."""
    buf, _ = local_sharded(kind, k=3)
    twin, _ = local_sharded(kind, k=3)
    assert 'hold 0 items' in buf.why_not_sample(2)
    with pytest.raises(SampleTimeoutError):
        buf.why_not_sample(2, timeout=0.1)
    for b in (buf, twin):
        b.extend({'obs': torch.arange(12.0).reshape(12, 1), 'env': torch.arange(12)})
    assert buf.why_not_sample(12) == '' and buf.why_not_sample(5, timeout=0.1) == ''
    if kind == 'naive':
        assert 'fewer than 13' in buf.why_not_sample(13) and buf.sample(13) is None
    for _ in range(3):
        assert torch.equal(buf.sample(5)['obs'], twin.sample(5)['obs'])  # the RNG did not move
    with pytest.raises(ValueError, match='sample size must be an int > 0'):
        buf.why_not_sample(0)


def test_dingengines_short_state_form_pushes_the_items_across_the_shards():
    """``load_state_dict({'data': [...]})`` pushes the items on every buffer (DI-engine's form); a sharded buffer
    refused it as "not a sharded buffer's state"."""
    buf, _ = local_sharded('naive', k=2)
    buf.load_state_dict({'data': [item(i) for i in range(6)]})
    assert buf.count() == 6
    assert sorted(buf.sample(6)['obs'][:, 0].tolist()) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    with pytest.raises(TypeError, match="state 'data' must be a list of items"):
        buf.load_state_dict({'data': 'abc'})
    with pytest.raises(TypeError, match='deepcopy must be a bool'):
        buf.load_state_dict({'data': [item(7)]}, deepcopy='yes')
    assert buf.count() == 6
    buf.load_state_dict(types.MappingProxyType({'data': [item(7)]}))
    assert buf.count() == 7


def test_an_advanced_buffer_of_the_default_capacity_takes_updates_across_shards():
    """The client reads the type's defaults (and key aliases) as its shards do: with no ``replay_buffer_size`` given,
    the rows of a sample still route their updates."""
    cfg = dict(type='advanced', storage=dict(type='tensor'), seed=0)
    buf = ShardedBuffer([create_buffer(dict(cfg, seed=i)) for i in range(2)], cfg, seed=0)
    buf.push([{'obs': torch.tensor([float(i)])} for i in range(2)])
    buf.push([{'obs': torch.tensor([float(i)])} for i in range(2, 4)])
    s = buf.sample(4)
    keys = ('replay_unique_id', 'replay_buffer_idx', 'shard')
    assert buf.update({**{k: s[k] for k in keys}, 'priority': torch.full((4,), 2.0)}) == {'updated': 4, 'stale': 0}


def test_a_lazy_gfn_draw_without_replacement_beyond_one_reply_is_refused_and_draws_nothing():
    cfg = dict(type='gfn', replay_buffer_size=10, lazy_sort=True, seed=0)
    buf = ShardedBuffer([create_buffer(dict(cfg, seed=i)) for i in range(2)], cfg, seed=0)
    buf.push({'state': torch.arange(18.0).unsqueeze(1), 'log_reward': torch.zeros(18)})  # one call: one shard
    before = buf.state_dict()
    with pytest.raises(ValueError, match=r'shard 0 of 2 holds 18 items.*replay_buffer_size=10'):
        buf.sample(15)
    assert_same(buf.state_dict(), before)
    ids = buf.sample(10)['state'][:, 0].tolist()
    assert len(set(ids)) == 10
    assert len(buf.sample(15, replace=True)['state']) == 15
