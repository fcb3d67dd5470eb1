"""The `chunk` buffer (MineStudio's online replay protocol) against a brute-force model of its rules, plus the
blocking fetch, the payload store with reference-counted deletion, persistence, bad input and the manager."""

import collections
import copy
import enum
import os
import threading
import time
from collections import OrderedDict

import numpy as np
import pytest
import torch
from easydict import EasyDict
from helpers import assert_same

from ding_buffer import create_buffer
from ding_buffer.errors import SampleTimeoutError
from ding_buffer.storage.fragment_store import FragmentStore

# An outer bound on waits that must end (a hang fails the test); never a speed requirement: a loaded machine passes.
GENEROUS = 30.0


def payload(worker: int, fid: int) -> dict:
    return {'obs': torch.tensor([float(worker), float(fid)]), 'step': torch.arange(3) + fid}


def frag(worker: int, fid: int, version: int, session: str = '', **kw) -> dict:
    out = {'worker': f'w{worker}', 'fid': fid, 'model_version': version, 'session_id': session}
    out.update(kw) if kw else out.update(data=payload(worker, fid))
    return out


class Model:
    """The rules of buffers/chunk.py written the plain way: lists, no references, no store."""

    def __init__(self, max_chunks, fpc, max_reuse, max_staleness, seed):
        self.max_chunks, self.fpc, self.max_reuse, self.lag = max_chunks, fpc, max_reuse, max_staleness
        self.rng = np.random.default_rng(seed)
        self.version, self.session = -1, ''
        self.chunks = []  # [use, [(worker, fid, version, session)]]
        self.queues = {}
        self.last = {}
        self.last_fetch = []

    def stale(self, version, session):
        if self.session and session != self.session:
            return True
        return self.lag is not None and self.version - version > self.lag

    def push(self, frags):
        """The fragments one by one; all or nothing."""
        saved = copy.deepcopy((self.last, self.queues, self.chunks))
        try:
            for f in frags:
                self.push_one(f)
        except ValueError:
            self.last, self.queues, self.chunks = saved
            raise

    def push_one(self, f):
        w, fid = f['worker'], f['fid']
        q = self.queues.setdefault(w, [])
        if w in self.last and (fid != self.last[w] + 1 if q else fid <= self.last[w]):
            raise ValueError('order')
        self.last[w] = fid
        q.append((w, fid, f['model_version'], f['session_id']))
        while q and self.stale(q[0][2], q[0][3]):
            q.pop(0)
        if not q:
            del self.queues[w]
        elif len(q) == self.fpc:
            del self.queues[w]
            if not self.stale(q[0][2], q[0][3]):
                while len(self.chunks) >= self.max_chunks:
                    self.chunks.pop(0)
                self.chunks.append([0, q])

    def update_model_version(self, version, session=None):
        self.version = version
        if session is not None:
            self.session = session
        self.chunks = [c for c in self.chunks if not self.stale(c[1][0][2], c[1][0][3])]
        for w in list(self.queues):  # a queue loses the prefix up to its newest stale fragment
            q = self.queues[w]
            while any(self.stale(r[2], r[3]) for r in q):
                q.pop(0)
            if not q:
                del self.queues[w]

    def sample(self, n):
        k = n // self.fpc
        if len(self.chunks) < k:
            return None
        picked = self.rng.choice(len(self.chunks), size=k, replace=False)
        out = []
        for j in picked:
            self.chunks[j][0] += 1
            out += [(r[0], r[1], self.chunks[j][0]) for r in self.chunks[j][1]]
        self.chunks = [c for c in self.chunks if self.max_reuse is None or c[0] < self.max_reuse]
        self.last_fetch = [(w, f) for w, f, _ in out]
        return out

    def records(self):
        return [[r for r in c[1]] for c in self.chunks], {w: list(q) for w, q in self.queues.items()}

    def referenced(self):
        held = {(r[0], r[1]) for c in self.chunks for r in c[1]}
        held |= {(r[0], r[1]) for q in self.queues.values() for r in q}
        return held | set(self.last_fetch)


def buffer_records(buf):
    rec = buf.records()
    return [[tuple(r) for r in ch[2]] for ch in rec['chunks']], {
        w: [tuple(r) for r in q] for w, q in rec['queues'].items()
    }


CONFIGS = [
    dict(max_chunks=50, fragments_per_chunk=1, max_reuse=2, max_staleness=2),
    dict(max_chunks=4, fragments_per_chunk=3, max_reuse=1, max_staleness=1),
    dict(max_chunks=6, fragments_per_chunk=2, max_reuse=None, max_staleness=None),
    dict(max_chunks=10, fragments_per_chunk=2, max_reuse=3, max_staleness=0),
]


CASES = [(cfg, 'memory', seed) for cfg in CONFIGS for seed in (0, 1)] + [(cfg, 'disk', 0) for cfg in CONFIGS]


@pytest.mark.parametrize(
    'cfg, store, seed', CASES, ids=[f"{'-'.join(f'{k[:5]}{v}' for k, v in c.items())}-{st}-{sd}" for c, st, sd in CASES]
)
def test_random_calls_match_the_brute_force_model(tmp_path, cfg, store, seed):
    scfg = dict(type='disk', path=str(tmp_path / 'store')) if store == 'disk' else dict(type='memory')
    buf = create_buffer(dict(type='chunk', seed=seed, store=scfg, **cfg))
    model = Model(cfg['max_chunks'], cfg['fragments_per_chunk'], cfg['max_reuse'], cfg['max_staleness'], seed)
    rng = np.random.default_rng(100 + seed)
    next_fid = {w: 0 for w in range(4)}
    fpc = cfg['fragments_per_chunk']
    sessions = ['', 's1', 's2']
    for step in range(400):
        op = rng.random()
        if op < 0.55:  # a push of 1-4 fragments, mostly in order
            frags = []
            for _ in range(int(rng.integers(1, 5))):
                w = int(rng.integers(4))
                fid = next_fid[w]
                if rng.random() < 0.1:  # a gap, a repeat or a reordering
                    fid += int(rng.choice([-1, 0, 2]))
                elif rng.random() < 0.05:  # a restart that skips ahead (allowed between chunks only)
                    fid += 5
                next_fid[w] = max(next_fid[w], fid + 1)
                version = max(-1, model.version + int(rng.integers(-3, 2)))
                session = model.session if rng.random() < 0.9 else str(rng.choice(sessions))
                frags.append(frag(w, fid, version, session))
            before = buffer_records(buf), buf.stats()
            try:
                model.push(frags)
            except ValueError:
                with pytest.raises(ValueError, match='arrive in order'):
                    buf.push(frags)
                assert (buffer_records(buf), buf.stats()) == before  # nothing changed
                for w in range(4):  # the model's view of what each worker may send next
                    next_fid[w] = model.last.get(f'w{w}', -1) + 1
                continue
            assert buf.push(frags) == len(frags)
        elif op < 0.7:
            session = None if rng.random() < 0.7 else str(rng.choice(sessions[1:]))
            version = model.version + int(rng.integers(0, 3))
            model.update_model_version(version, session)
            buf.update_model_version(version, session)
        else:
            n = fpc * int(rng.integers(1, 4))
            expected = model.sample(n)
            got = buf.sample(n)
            if expected is None:
                assert got is None
            else:
                assert [(x['worker'], x['fid'], x['use']) for x in got] == expected
                for x in got:
                    w, fid = int(x['worker'][1:]), x['fid']
                    assert torch.equal(x['data']['obs'], payload(w, fid)['obs'])
        assert buffer_records(buf) == model.records(), step
        if step % 97 == 96:  # a state round trip keeps everything, the running counts included
            buf.load_state_dict(buf.state_dict())
        assert buf.stats()['fragments'] == sum(len(ch) for ch in model.records()[0]), step
        # rule 7: exactly the referenced payloads are in the store
        assert len(buf.store.ids()) == len(model.referenced()) == buf.stats()['payloads'], step
        assert buf.stats()['store_bytes'] == buf.store.nbytes(), step  # the running total equals the disk's
    buf.clear()
    assert buf.stats()['fragments'] == 0 and buffer_records(buf)[0] == []
    buf.close()


def test_a_gap_repeat_or_reorder_is_refused_and_changes_nothing():
    buf = create_buffer(dict(type='chunk', fragments_per_chunk=3))
    buf.push([frag(0, 0, 0), frag(0, 1, 0)])
    state = buf.records()
    for bad in (3, 1, 0):
        with pytest.raises(ValueError, match=rf"worker 'w0' sent fid {bad} after 1; expected exactly 2"):
            buf.push([frag(1, 0, 0), frag(0, bad, 0)])  # the good fragment before it is not stored either
        assert buf.records() == state
    buf.push(frag(0, 2, 0))  # completes the chunk
    with pytest.raises(ValueError, match='expected more than 2'):
        buf.push(frag(0, 2, 0))
    buf.push(frag(0, 10, 0))  # between chunks a worker may skip ahead (its stale fragments were dropped upstream)
    assert buf.count() == 1 and buf.records()['queues'] == {'w0': [('w0', 10, 0, '')]}


@pytest.mark.parametrize(
    'bad, match',
    [
        ('not a dict', 'must be a dict'),
        ({'worker': 'w', 'fid': 0, 'model_version': 0}, "exactly one of 'data'"),
        ({'worker': 'w', 'fid': 0, 'model_version': 0, 'data': 1, 'fragment_id': 'a' * 32}, "exactly one of 'data'"),
        ({'worker': '', 'fid': 0, 'model_version': 0, 'data': 1}, "'worker' must be"),
        ({'worker': 'w\n', 'fid': 0, 'model_version': 0, 'data': 1}, "'worker' must be"),
        ({'worker': 'w', 'fid': 1.0, 'model_version': 0, 'data': 1}, "'fid' must be an int"),
        ({'worker': 'w', 'fid': True, 'model_version': 0, 'data': 1}, "'fid' must be an int"),
        ({'worker': 'w', 'fid': 0, 'model_version': 2**63, 'data': 1}, "'model_version' must be an int"),
        ({'worker': 'w', 'fid': 0, 'model_version': 0, 'session_id': 5, 'data': 1}, "'session_id' must be"),
        ({'worker': 'w', 'fid': 0, 'model_version': 0, 'fragment_id': '../../etc/passwd'}, '32 lowercase hex'),
        ({'worker': 'w', 'fid': 0, 'model_version': 0, 'fragment_id': 'b' * 32}, 'not in the store'),
        ({'worker': 'w', 'fid': 0, 'model_version': 0, 'data': 1, 'priority': 3}, 'unknown keys'),
    ],
)
def test_bad_fragments_are_refused_with_their_key_and_change_nothing(bad, match):
    buf = create_buffer(dict(type='chunk', fragments_per_chunk=2, seed=0))
    buf.push(frag(0, 0, 0))
    before = buf.state_dict()
    with pytest.raises((ValueError, TypeError), match=match):
        buf.push([frag(1, 0, 0), bad])
    after = buf.state_dict()
    assert after['queues'] == before['queues'] and after['counters'] == before['counters']
    assert set(after['payloads']) == set(before['payloads']) and len(buf.store.ids()) == 1


@pytest.mark.parametrize(
    'key, value, match',
    [
        ('fragments_per_chunk', 0, 'fragments_per_chunk'),
        ('max_reuse', 0, 'max_reuse'),
        ('max_staleness', -1, 'max_staleness'),
        ('max_chunks', 1.5, 'max_chunks'),
        ('sample_payloads', 1, 'sample_payloads'),
        ('store', dict(type='redis'), 'store.type'),
        ('store', dict(type='disk'), 'store.path'),
    ],
)
def test_bad_config_names_the_key(key, value, match):
    with pytest.raises(ValueError, match=match):
        create_buffer({'type': 'chunk', key: value})


def test_sample_sizes_are_whole_chunks():
    buf = create_buffer(dict(type='chunk', fragments_per_chunk=2, max_chunks=3))
    with pytest.raises(ValueError, match='multiple of fragments_per_chunk=2'):
        buf.sample(3)
    with pytest.raises(ValueError, match='at most max_chunks=3'):
        buf.sample(8)
    with pytest.raises(TypeError, match='replace'):
        buf.sample(2, replace=True)
    assert buf.sample(2) is None  # nothing yet: None, as every buffer


def test_blocking_fetch_waits_for_producers_and_times_out():
    buf = create_buffer(dict(type='chunk', fragments_per_chunk=2, seed=0))
    buf.push(frag(0, 0, 0))
    got = {}

    def learner():
        got['out'] = buf.sample(4, timeout=2 * GENEROUS)

    t = threading.Thread(target=learner)
    t.start()
    time.sleep(0.2)
    assert t.is_alive()  # 0 chunks: waiting
    buf.push([frag(0, 1, 0), frag(1, 0, 0)])
    time.sleep(0.1)
    assert t.is_alive()  # 1 chunk of the 2 needed
    buf.push(frag(1, 1, 0))
    t.join(GENEROUS)
    assert not t.is_alive()
    assert sorted((x['worker'], x['fid']) for x in got['out']) == [('w0', 0), ('w0', 1), ('w1', 0), ('w1', 1)]
    t0 = time.monotonic()
    with pytest.raises(SampleTimeoutError, match='2 of the 3 chunks'):
        buf.sample(6, timeout=0.3)  # both chunks were used once; max_reuse=2 keeps them: 2 chunks, ask for 3
    assert 0.3 <= time.monotonic() - t0 < GENEROUS  # waited its timeout (the upper bound only catches a hang)


def test_close_wakes_a_waiting_fetch():
    buf = create_buffer(dict(type='chunk'))
    errors = []

    def learner():
        try:
            buf.sample(1, timeout=2 * GENEROUS)
        except RuntimeError as e:
            errors.append(e)

    t = threading.Thread(target=learner)
    t.start()
    time.sleep(0.2)
    buf.close()
    t.join(GENEROUS)
    assert not t.is_alive() and 'closed' in str(errors[0])  # woken by close, long before its timeout


def test_disk_store_ids_on_the_wire_and_files_deleted_when_unreferenced(tmp_path):
    path = str(tmp_path / 'fragments')
    buf = create_buffer(
        dict(
            type='chunk',
            fragments_per_chunk=2,
            max_reuse=1,
            max_chunks=2,
            sample_payloads=False,
            store=dict(type='disk', path=path),
            seed=0,
        )
    )
    producer, learner = FragmentStore('disk', path), FragmentStore('disk', path)  # other processes' views
    ids = {}
    for w in range(3):
        for fid in range(2):
            ids[(w, fid)] = producer.put(payload(w, fid))
            buf.push(frag(w, fid, 0, fragment_id=ids[(w, fid)]))
    # capacity 2 chunks: worker 0's chunk was evicted and its files deleted
    assert sorted(producer.ids()) == sorted(v for (w, _), v in ids.items() if w != 0)
    out = buf.sample(2)  # one chunk, ids only
    assert all('data' not in x for x in out)
    for x in out:
        w, fid = int(x['worker'][1:]), x['fid']
        assert torch.equal(learner.get(x['fragment_id'])['step'], payload(w, fid)['step'])
    first = {x['fragment_id'] for x in out}
    assert first <= producer.ids()  # max_reuse=1 retired the chunk, the last fetch still holds its files
    buf.sample(2)  # the other chunk: the previous fetch's files go
    assert not first & producer.ids() and len(producer.ids()) == 2
    with pytest.raises(KeyError, match='no fragment'):
        learner.get(next(iter(first)))
    buf.clear()
    assert producer.ids() == set()


def test_stale_and_other_session_fragments_are_dropped_at_the_queue_and_their_payloads_deleted(tmp_path):
    buf = create_buffer(
        dict(
            type='chunk',
            fragments_per_chunk=2,
            max_staleness=1,
            seed=0,
            store=dict(type='disk', path=str(tmp_path / 's')),
        )
    )
    buf.update_model_version(5, 'a')
    buf.push([frag(0, 0, 3, 'a'), frag(1, 0, 5, 'b'), frag(2, 0, 4, 'a')])  # too old, other session, fresh
    assert buf.records()['queues'] == {'w2': [('w2', 0, 4, 'a')]} and len(buf.store.ids()) == 1
    buf.push(frag(2, 1, 5, 'a'))
    assert buf.count() == 1
    out = buf.update_model_version(6)  # the chunk's first fragment (version 4) is now 2 versions behind
    assert out['chunks_dropped'] == 1 and buf.count() == 0 and buf.store.ids() == set()


@pytest.mark.parametrize('store', ['memory', 'disk'])
def test_save_and_load_round_trip_then_identical_samples(tmp_path, store):
    scfg = dict(type='disk', path=str(tmp_path / 'a')) if store == 'disk' else dict(type='memory')
    cfg = dict(type='chunk', fragments_per_chunk=2, max_reuse=3, seed=4, store=scfg)
    buf = create_buffer(cfg)
    for w in range(3):
        buf.push([frag(w, fid, 0) for fid in range(5)])
    buf.sample(2)
    buf.save_data(str(tmp_path / 'chunk.pt'))
    saved = buf.records()
    expected = buf.sample(4)
    cfg2 = dict(cfg, store=dict(type='disk', path=str(tmp_path / 'b')) if store == 'disk' else dict(type='memory'))
    other = create_buffer(cfg2)
    other.load_data(str(tmp_path / 'chunk.pt'))
    assert other.records() == saved
    got = other.sample(4)
    assert [(x['worker'], x['fid'], x['use']) for x in got] == [(x['worker'], x['fid'], x['use']) for x in expected]
    for a, b in zip(got, expected):
        assert torch.equal(a['data']['step'], b['data']['step'])
    assert other.stats()['queued_fragments'] == buf.stats()['queued_fragments'] == 3


def test_a_corrupt_state_is_refused_and_changes_nothing():
    buf = create_buffer(dict(type='chunk', fragments_per_chunk=1, seed=0))
    buf.push([frag(0, 0, 0), frag(0, 1, 0)])
    state = buf.state_dict()
    other = create_buffer(dict(type='chunk', fragments_per_chunk=1, seed=0))
    other.push(frag(5, 0, 0))
    before = other.records()
    broken = dict(state, payloads={})
    with pytest.raises(ValueError, match='lacks the payloads'):
        other.load_state_dict(broken)
    bad_id = dict(state, chunks=[dict(state['chunks'][0], records=[['w0', 0, 0, '', '../x']])])
    with pytest.raises(ValueError, match='32 lowercase hex'):
        other.load_state_dict(bad_id)
    assert other.records() == before and len(other.store.ids()) == 1


def test_the_manager_serves_the_chunk_protocol_and_its_version_op_gates_the_buffer():
    from ding_buffer.distributed.config import build_distributed_config
    from ding_buffer.distributed.manager import ManagerCore

    buf = create_buffer(dict(type='chunk', fragments_per_chunk=2, max_staleness=0, seed=0))
    core = ManagerCore(buf, build_distributed_config(dict(backend='torch')), 'log_reward')

    def call(op, **args):
        reply = core.handle('w', {'op': op, 'id': 1, 'shard': 0, 'args': args})
        assert reply['ok'], reply
        return reply['result']

    call('push', data=[frag(0, 0, 0), frag(0, 1, 0)], client='c', seq=0)
    assert call('count') == 1
    out = call('sample', size=2)
    assert [(x['worker'], x['fid']) for x in out] == [('w0', 0), ('w0', 1)]
    assert call('model_version', version=1)['chunks_dropped'] == 1  # the buffer's own gate moved
    assert call('count') == 0
    bad = core.handle('w', {'op': 'push', 'id': 2, 'shard': 0, 'args': dict(data=frag(0, 0, 1), client='c', seq=1)})
    assert not bad['ok'] and bad['error'] == 'ValueError' and 'arrive in order' in bad['message']


def test_a_disk_store_refuses_payloads_it_could_not_read_back(tmp_path):
    import datetime

    buf = create_buffer(dict(type='chunk', store=dict(type='disk', path=str(tmp_path / 's'))))
    for bad in (datetime.date(2020, 1, 1), {'x': {1, 2}}, np.array([object()], dtype=object), {(1, 2): 3}):
        with pytest.raises(TypeError, match='disk store'):
            buf.push(dict(worker='w', fid=0, model_version=0, data=bad))
    assert buf.store.ids() == set() and buf.stats()['fragments_received'] == 0
    buf.push(dict(worker='w', fid=0, model_version=0, data={'obs': torch.zeros(2), 'meta': [1, 'a', None, 2.5]}))
    assert buf.sample(1)[0]['data']['meta'] == [1, 'a', None, 2.5]


def test_a_state_with_a_restarted_forgotten_worker_loads_back():
    """A worker forgotten among MAX_WORKERS others may start again at any fid: its stored chunks then have fids past
    its new last one. The buffer reached that state through valid pushes, so it loads back, and samples on alike."""
    from ding_buffer.buffers.chunk_table import MAX_WORKERS

    cfg = dict(type='chunk', max_chunks=MAX_WORKERS + 10, fragments_per_chunk=1, max_reuse=None, seed=0)
    buf = create_buffer(cfg)
    frag = lambda w, f: dict(worker=w, fid=f, model_version=0, data=f)  # noqa: E731
    buf.push([frag('w0', 0), frag('w0', 1), frag('w0', 2)])
    buf.push([frag(f'x{i}', 0) for i in range(MAX_WORKERS)])  # w0, idle, is forgotten
    buf.push(frag('w0', 0))  # and starts again
    other = create_buffer(cfg)
    other.load_state_dict(buf.state_dict())
    assert other.count() == buf.count() == MAX_WORKERS + 4
    assert [c['data'] for c in other.sample(8)] == [c['data'] for c in buf.sample(8)]


def test_a_bit_flipped_fragment_file_is_refused_and_the_failed_sample_changes_nothing(tmp_path):
    """A fragment file read back from disk (by a sample, or by a learner's own store) is checked against its
    CRC-32 checksums: one flipped bit of a payload is a ValueError, never other data."""
    import struct
    import zipfile

    path = str(tmp_path / 's')
    buf = create_buffer(dict(type='chunk', max_reuse=2, seed=0, store=dict(type='disk', path=path)))
    buf.push(dict(worker='w', fid=0, model_version=0, data={'x': torch.full((64,), 7, dtype=torch.uint8)}))
    (fid,) = buf.store.ids()
    saved = str(tmp_path / 'saved.pt')
    buf.save_data(saved)
    file = os.path.join(path, fid + '.pt')
    with open(file, 'rb') as f:
        good = f.read()
    with zipfile.ZipFile(file) as z:
        info = next(i for i in z.infolist() if i.filename.endswith('/data/0'))
    name_len, extra_len = struct.unpack('<HH', good[info.header_offset + 26 : info.header_offset + 30])
    bad = bytearray(good)
    bad[info.header_offset + 30 + name_len + extra_len + 5] ^= 0x01  # one bit of the tensor's bytes
    with open(file, 'wb') as f:
        f.write(bytes(bad))
    before = buf.stats()
    with pytest.raises(ValueError, match='CRC-32'):
        buf.sample(1)
    with pytest.raises(ValueError, match='CRC-32'):
        FragmentStore('disk', path).get(fid)  # a learner reading the id it sampled
    assert buf.stats() == before
    buf.load_data(saved)  # a good save puts its payloads back, the damaged file's too
    assert buf.sample(1)[0]['data']['x'].tolist() == [7] * 64
    with open(file, 'rb') as f:
        assert f.read() != bytes(bad)
    os.remove(file)
    with pytest.raises(KeyError, match='deleted, or never put'):
        FragmentStore('disk', path).get(fid)


def test_a_disk_store_round_trips_numpy_payloads_through_samples_states_and_files(tmp_path):
    data = {
        'obs': np.arange(6.0).reshape(2, 3),
        'act': np.int64(4),
        'mask': np.array([True, False]),
        'tag': 'a',
        'none': np.zeros((2, 0)),  # empty arrays, b'' and empty numpy strings pickle through bytes()
        'raw': b'',
        'name': np.str_(''),
    }
    cfg = dict(type='chunk', max_reuse=None, seed=0, store=dict(type='disk', path=str(tmp_path / 's')))
    buf = create_buffer(cfg)
    buf.push(dict(worker='w', fid=0, model_version=0, data=data))

    def same(got):
        assert got.keys() == data.keys() and got['tag'] == 'a' and got['act'] == 4 and type(got['act']) is np.int64
        assert got['raw'] == b'' and got['name'] == '' and type(got['name']) is np.str_
        for key in ('obs', 'mask', 'none'):
            assert type(got[key]) is np.ndarray and got[key].dtype == data[key].dtype
            assert np.array_equal(got[key], data[key])

    same(buf.sample(1)[0]['data'])
    state = buf.state_dict()
    buf.save_data(str(tmp_path / 'chunk.pt'))  # a buffer file of numpy payloads: pickled objects, as list storage's
    other = create_buffer(dict(cfg, store=dict(type='disk', path=str(tmp_path / 't'))))
    other.load_data(str(tmp_path / 'chunk.pt'), allow_pickle=True)
    same(other.sample(1)[0]['data'])
    restored = create_buffer(dict(cfg, store=dict(type='disk', path=str(tmp_path / 'u'))))
    restored.load_state_dict(state)
    same(restored.sample(1)[0]['data'])


def test_a_disk_store_read_keeps_the_users_own_safe_globals(tmp_path):
    """torch's allow-list of globals for ``weights_only`` loads is the process's: a user who allowed numpy arrays
    for their own checkpoints keeps them after the buffer read its payloads (and loaded a buffer file)."""
    import torch

    from ding_buffer.storage.fragment_store import numpy_globals

    mine = list(numpy_globals())
    torch.serialization.add_safe_globals(mine)
    try:
        cfg = dict(type='chunk', max_reuse=None, seed=0, store=dict(type='disk', path=str(tmp_path / 's')))
        buf = create_buffer(cfg)
        buf.push(dict(worker='w', fid=0, model_version=0, data={'obs': np.arange(3.0)}))
        assert np.array_equal(buf.sample(1)[0]['data']['obs'], np.arange(3.0))
        buf.save_data(str(tmp_path / 'chunk.pt'))
        create_buffer(dict(cfg, store=dict(type='disk', path=str(tmp_path / 't')))).load_data(
            str(tmp_path / 'chunk.pt'), allow_pickle=True
        )
        assert set(mine) <= set(torch.serialization.get_safe_globals())
        torch.save({'w': np.ones(2)}, tmp_path / 'user.pt')  # the user's own checkpoint still loads
        assert np.array_equal(torch.load(tmp_path / 'user.pt', weights_only=True)['w'], np.ones(2))
    finally:
        torch.serialization.clear_safe_globals()
    assert torch.serialization.get_safe_globals() == []  # (and the buffer's reads added none for good)


def test_a_sample_whose_payload_cannot_be_read_changes_nothing(tmp_path):
    path = str(tmp_path / 's')
    buf = create_buffer(dict(type='chunk', max_reuse=1, seed=0, store=dict(type='disk', path=path)))
    buf.push([frag(0, 0, 0), frag(0, 1, 0)])
    first = buf.sample(1)[0]['fragment_id']
    (remaining,) = [x for x in buf.store.ids() if x != first]
    os.remove(os.path.join(path, remaining + '.pt'))  # a peer sharing the directory deleted it
    before = buf.records(), buf.stats()
    with pytest.raises(KeyError, match='no fragment'):
        buf.sample(1)
    assert (buf.records(), buf.stats()) == before and first in buf.store.ids()  # the last fetch still held


@pytest.mark.parametrize(
    'corrupt, match',
    [
        (lambda st: st['chunks'][0].update(records=st['chunks'][0]['records'][:1]), 'fragments_per_chunk'),
        (lambda st: st['chunks'][0].update(use=5), 'max_reuse'),
        (lambda st: st['chunks'].append(dict(st['chunks'][0])), 'repeated uid|two places'),
        (lambda st: st['chunks'][0]['records'][1].__setitem__(0, 'w9'), 'consecutive'),
        (lambda st: st['queues']['w1'][0].__setitem__(1, 7), 'last fid'),
        (lambda st: st.update(model_version=2**80), 'model_version'),
        (lambda st: st['counters'].update(chunks_made=-1), 'counter'),
        (lambda st: st.update(session_id=5), 'session_id'),
        (lambda st: st['queues']['w1'][0].__setitem__(0, 'x' * 200), 'worker'),
    ],
)
def test_an_inconsistent_state_is_refused(corrupt, match):
    import copy

    buf = create_buffer(dict(type='chunk', fragments_per_chunk=2, max_reuse=2, seed=0))
    buf.push([frag(0, 0, 0), frag(0, 1, 0), frag(1, 0, 0)])
    state = copy.deepcopy(buf.state_dict())
    corrupt(state)
    other = create_buffer(dict(type='chunk', fragments_per_chunk=2, max_reuse=2, seed=0))
    with pytest.raises(ValueError, match=match):
        other.load_state_dict(state)
    assert other.count() == 0 and other.store.ids() == set()


def test_the_order_of_the_least_recently_seen_workers_is_forgotten_at_the_cap(monkeypatch):
    from ding_buffer.buffers import chunk_table as chunk_module

    monkeypatch.setattr(chunk_module, 'MAX_WORKERS', 4)
    buf = create_buffer(dict(type='chunk', fragments_per_chunk=2))
    buf.push([frag(w, 0, 0) for w in range(4)])  # four workers, each with a chunk in assembly
    with pytest.raises(ValueError, match='4 workers have chunks in assembly'):
        buf.push(frag(9, 0, 0))
    buf.push([frag(w, 1, 0) for w in range(4)])  # chunks done: nothing in assembly
    buf.push(frag(9, 0, 0))  # worker 0, the least recently seen, is forgotten
    buf.push(frag(0, 0, 0))  # and may start again at any fid
    assert buf.stats()['workers'] == 4 and buf.count() == 4


def test_loading_a_state_wakes_a_waiting_fetch():
    src = create_buffer(dict(type='chunk', seed=0))
    src.push(frag(0, 0, 0))
    state = src.state_dict()
    buf = create_buffer(dict(type='chunk', seed=0))
    got = {}
    t = threading.Thread(target=lambda: got.setdefault('out', buf.sample(1, timeout=2 * GENEROUS)))
    t.start()
    time.sleep(0.2)
    buf.load_state_dict(state)
    t.join(GENEROUS)
    assert not t.is_alive()
    assert got['out'][0]['fid'] == 0  # woken by the load with the loaded chunk (a timeout raises: no 'out')


@pytest.mark.parametrize('timeout', [-1, float('nan'), float('inf'), 1e300, True, '1'])
def test_bad_timeouts_are_refused(timeout):
    buf = create_buffer(dict(type='chunk'))
    with pytest.raises(ValueError, match='timeout'):
        buf.sample(1, timeout=timeout)


@pytest.mark.parametrize('step', ['3', float('nan'), 4.5, 2**63, torch.tensor(3)])
def test_a_bad_learner_iteration_is_refused_by_sample_as_by_why_not_sample(step):
    """``cur_learner_iter`` is not read by a chunk sample (None is taken), but a value every other type refuses
    was taken."""
    buf = create_buffer(dict(type='chunk', fragments_per_chunk=1, max_reuse=3, seed=0))
    buf.push(frag(0, 0, 0, 'a'))
    before = buf.state_dict()
    for call in (buf.sample, buf.why_not_sample):
        with pytest.raises((TypeError, ValueError), match='cur_learner_iter'):
            call(1, step)
    assert_same(buf.state_dict(), before)
    assert buf.sample(1, np.int64(3))[0]['fid'] == buf.sample(1, None)[0]['fid'] == 0  # (a numpy int is an int)


def test_a_version_update_removes_only_a_prefix_of_a_queue_and_the_state_still_loads(tmp_path):
    cfg = dict(type='chunk', fragments_per_chunk=4, max_staleness=1, seed=0)
    buf = create_buffer(cfg)
    buf.update_model_version(5)
    buf.push([frag(0, 0, 5, 'b'), frag(0, 1, 4, 'b'), frag(0, 2, 5, 'b')])  # fresh, stale-to-be, fresh
    buf.push([frag(1, 0, 5, 'b'), frag(1, 1, 5, 'a')])  # another worker's queue in two sessions
    out = buf.update_model_version(6)
    # fid 1 of w0 is stale: fid 0 before it can no longer be in a chunk with fid 2, so it goes too (counted)
    assert out['fragments_dropped'] == 2 and buf.records()['queues']['w0'] == [('w0', 2, 5, 'b')]
    out = buf.update_model_version(6, 'b')  # w1's newest fragment is of another session: its whole queue goes
    assert out['fragments_dropped'] == 2 and 'w1' not in buf.records()['queues']
    assert buf.stats()['fragments_dropped'] == 4
    buf.push([frag(0, 3, 6, 'b'), frag(1, 2, 6, 'b')])  # w0: 2, 3 queued; w1 starts over at 2
    buf.push([frag(0, 4, 6, 'b'), frag(0, 5, 6, 'b')])
    assert buf.records()['chunks'][0][2] == [('w0', fid, 5 if fid == 2 else 6, 'b') for fid in range(2, 6)]
    other = create_buffer(cfg)
    other.load_state_dict(buf.state_dict())
    assert other.records() == buf.records() and len(buf.store.ids()) == len(other.store.ids()) == 5
    buf.save_data(str(tmp_path / 'c.pt'))
    third = create_buffer(cfg)
    third.load_data(str(tmp_path / 'c.pt'))
    assert third.records() == buf.records()


def _outcome(call):
    """A call's result as comparable data (an error as its type and message)."""
    try:
        result = call()
    except (ValueError, TypeError) as e:
        return ('error', type(e).__name__, str(e))
    if isinstance(result, list):  # a sample: every field, payloads as lists
        return [
            {k: ({n: t.tolist() for n, t in v.items()} if k == 'data' else v) for k, v in x.items()} for x in result
        ]
    return result


ROUND_TRIP_CONFIGS = [
    dict(max_chunks=5, fragments_per_chunk=3, max_reuse=2, max_staleness=1),
    dict(max_chunks=8, fragments_per_chunk=4, max_reuse=None, max_staleness=0),
    dict(max_chunks=20, fragments_per_chunk=1, max_reuse=3, max_staleness=2),
]
ROUND_TRIP_CASES = [(i, store) for i in range(len(ROUND_TRIP_CONFIGS)) for store in ('memory', 'disk')]


@pytest.mark.parametrize('case, store', ROUND_TRIP_CASES, ids=[f'cfg{i}-{st}' for i, st in ROUND_TRIP_CASES])
def test_every_reached_state_round_trips_and_the_next_call_is_identical(tmp_path, case, store):
    """Random pushes (several workers, sessions and model versions, fids mostly in order), version updates, samples
    and clears; after each call the buffer's own state (state_dict, or save_data every 4th call) loads into a fresh
    buffer, and the next call gives the same result on both."""
    cfg = ROUND_TRIP_CONFIGS[case]
    fpc = cfg['fragments_per_chunk']

    def make(name):
        scfg = dict(type='disk', path=str(tmp_path / name)) if store == 'disk' else dict(type='memory')
        return create_buffer(dict(type='chunk', seed=case, store=scfg, **cfg))

    buf = make('main')
    rng = np.random.default_rng(7 + case)
    next_fid, version, current, sessions = [0, 0, 0], -1, '', ['', 's1', 's2']
    for step in range(150):
        twin = make('twin')
        if step % 4 == 3:
            buf.save_data(str(tmp_path / 'state.pt'))
            twin.load_data(str(tmp_path / 'state.pt'))
        else:
            twin.load_state_dict(buf.state_dict())
        assert twin.records() == buf.records() and twin.stats() == buf.stats(), step
        op = rng.random()
        if op < 0.55:
            frags = []
            for _ in range(int(rng.integers(1, 5))):
                w = int(rng.integers(3))
                fid = next_fid[w] + (5 if rng.random() < 0.05 else 0)  # now and then a restart that skips ahead
                next_fid[w] = fid + 1
                v = max(-1, version + int(rng.integers(-2, 2)))
                frags.append(frag(w, fid, v, str(rng.choice(sessions)) if rng.random() < 0.15 else current))
            outcomes = [_outcome(lambda b=b: b.push(frags)) for b in (buf, twin)]
            if isinstance(outcomes[0], tuple):  # refused (a skip inside a chunk): go on from the buffer's last fids
                last = buf.state_dict()['last_fid']
                next_fid = [last.get(f'w{w}', -1) + 1 for w in range(3)]
        elif op < 0.75:
            version += int(rng.integers(0, 2))
            session = None if rng.random() < 0.7 else str(rng.choice(sessions[1:]))
            current = current if session is None else session
            outcomes = [_outcome(lambda b=b: b.update_model_version(version, session)) for b in (buf, twin)]
        elif op < 0.97:
            n = fpc * int(rng.integers(1, 4))
            outcomes = [_outcome(lambda b=b: b.sample(n)) for b in (buf, twin)]
        else:
            outcomes = [_outcome(b.clear) for b in (buf, twin)]
        assert outcomes[0] == outcomes[1], step
        assert twin.records() == buf.records() and twin.stats() == buf.stats(), step
        twin.close()
    assert buf.stats()['chunks_made'] > 10 and buf.stats()['fragments_dropped'] > 0
    buf.close()


@pytest.mark.parametrize('store', ['memory', 'disk'])
def test_editing_a_sample_in_place_does_not_change_later_samples(tmp_path, store):
    scfg = dict(type='disk', path=str(tmp_path / 's')) if store == 'disk' else dict(type='memory')
    buf = create_buffer(dict(type='chunk', fragments_per_chunk=2, max_reuse=4, seed=0, store=scfg))
    pushed = [frag(0, 0, 0), frag(0, 1, 0)]
    buf.push(pushed)
    for f in pushed:  # the producer reuses its tensors after the push
        f['data']['obs'].fill_(-1.0)
    first = buf.sample(2)
    for x in first:  # a learner edits its sample in place (normalising observations, say)
        x['data']['obs'].mul_(100.0)
        x['data']['step'].zero_()
        x['data']['extra'] = 'added'
    buf.state_dict()['payloads'][first[0]['fragment_id']]['step'].add_(7)  # and a checkpoint's copy
    second = buf.sample(2)
    assert [x['chunk'] for x in second] == [x['chunk'] for x in first]  # the same chunk again
    for x in second:
        w, fid = int(x['worker'][1:]), x['fid']
        assert torch.equal(x['data']['obs'], payload(w, fid)['obs'])
        assert torch.equal(x['data']['step'], payload(w, fid)['step']) and 'extra' not in x['data']
        assert x['data']['obs'].data_ptr() not in {y['data']['obs'].data_ptr() for y in first}


def _comparable(state):
    """A state with each fragment id replaced by its payload (two buffers give the same payloads other ids)."""
    data = {i: tuple(v.tolist() for v in p.values()) for i, p in state['payloads'].items()}
    records = lambda rs: [tuple(r[:4]) + (data[r[4]],) for r in rs]  # noqa: E731
    return dict(
        {k: v for k, v in state.items() if k not in ('payloads', 'chunks', 'queues', 'last_fetch')},
        chunks=[dict(ch, records=records(ch['records'])) for ch in state['chunks']],
        queues={w: records(q) for w, q in state['queues'].items()},
        last_fetch=[data[i] for i in state['last_fetch']],
    )


def test_a_list_push_of_a_stale_fragment_then_the_next_is_accepted_as_one_by_one():
    cfg = dict(type='chunk', fragments_per_chunk=2, max_staleness=0, seed=0)
    one, many = create_buffer(cfg), create_buffer(cfg)
    for buf in (one, many):
        buf.update_model_version(3)
    one.push(frag(0, 0, 1))  # stale on arrival: dropped, no chunk in assembly
    one.push(frag(0, 5, 3))  # so the worker may go on at any later fid
    many.push([frag(0, 0, 1), frag(0, 5, 3)])  # was refused: 'expected exactly 1'
    assert _comparable(many.state_dict()) == _comparable(one.state_dict())
    assert many.records()['queues'] == {'w0': [('w0', 5, 3, '')]} and many.stats()['fragments_dropped'] == 1
    with pytest.raises(ValueError, match='expected exactly 6'):  # all or nothing still
        many.push([frag(1, 0, 3), frag(0, 7, 3)])
    assert _comparable(many.state_dict()) == _comparable(one.state_dict())


def test_a_list_push_forgets_workers_at_the_cap_as_one_by_one(monkeypatch):
    from ding_buffer.buffers import chunk_table as chunk_module

    monkeypatch.setattr(chunk_module, 'MAX_WORKERS', 2)
    cfg = dict(type='chunk', fragments_per_chunk=2, seed=0)
    one, many = create_buffer(cfg), create_buffer(cfg)
    for buf in (one, many):
        buf.push([frag(0, 0, 0), frag(1, 0, 0)])  # two workers, both with a chunk in assembly
    one.push(frag(0, 1, 0))  # w0's chunk is done: it may be forgotten
    one.push(frag(2, 0, 0))  # and is, for w2
    many.push([frag(0, 1, 0), frag(2, 0, 0)])  # was refused: '2 workers have chunks in assembly'
    assert _comparable(many.state_dict()) == _comparable(one.state_dict())
    assert list(many.state_dict()['last_fid']) == ['w1', 'w2']


@pytest.mark.parametrize('store', ['memory', 'disk'])
@pytest.mark.parametrize('fpc, lag', [(1, 0), (2, 0), (3, 1)])
def test_a_list_push_is_the_same_fragments_pushed_one_by_one(tmp_path, store, fpc, lag):
    """Random lists (stale and other-session fragments, restarts that skip ahead, now and then a bad fid) pushed
    whole into one buffer and one by one into another: the list is refused exactly when one of the single pushes
    is, a refused list changes nothing, and otherwise the two states are identical."""

    def make(name):
        scfg = dict(type='disk', path=str(tmp_path / name)) if store == 'disk' else dict(type='memory')
        return create_buffer(
            dict(
                type='chunk', max_chunks=6, fragments_per_chunk=fpc, max_staleness=lag, seed=1, max_reuse=2, store=scfg
            )
        )

    many, one = make('many'), make('one')
    rng = np.random.default_rng(fpc * 10 + lag)
    next_fid, version, session = [0, 0, 0], 0, 's'
    for buf in (many, one):
        buf.update_model_version(version, session)
    refused = accepted = 0
    for step in range(200):
        op = rng.random()
        if op < 0.7:
            frags = []
            for _ in range(int(rng.integers(1, 6))):
                w = int(rng.integers(3))
                fid = next_fid[w] + int(rng.choice([0, 0, 0, 0, 0, 0, 3, -1]))
                next_fid[w] = max(next_fid[w], fid + 1)
                v = version - int(rng.choice([0, 0, 0, lag + 1]))
                frags.append(frag(w, fid, v, session if rng.random() < 0.9 else 'other'))
            before = _comparable(many.state_dict())
            try:
                many.push(frags)
                whole = True
            except ValueError:
                whole = False
                assert _comparable(many.state_dict()) == before
            single = True
            for f in frags:
                try:
                    one.push(f)
                except ValueError:
                    single = False
                    break
            assert whole == single, step
            if whole:
                accepted += 1
                assert _comparable(many.state_dict()) == _comparable(one.state_dict()), step
            else:  # the single pushes before the refused one went in: start both again from the list's buffer
                refused += 1
                one.load_state_dict(many.state_dict())
                last = many.state_dict()['last_fid']
                next_fid = [last.get(f'w{w}', -1) + 1 for w in range(3)]
        elif op < 0.85:
            version += 1
            for buf in (many, one):
                buf.update_model_version(version, session)
        else:
            n = fpc * int(rng.integers(1, 3))
            a, b = many.sample(n), one.sample(n)
            assert (a is None) == (b is None)
            if a is not None:
                assert [(x['worker'], x['fid'], x['use']) for x in a] == [(x['worker'], x['fid'], x['use']) for x in b]
        assert _comparable(many.state_dict()) == _comparable(one.state_dict()), step
    assert refused > 5 and accepted > 50 and many.stats()['fragments_dropped'] > 10


def test_chunk_takes_the_part_keys_that_fit_whole_chunks():
    """max_use (the engine presets' name) is max_reuse; removers take 'fifo' (the order it evicts in) and 'max_use'
    (the smaller limit applies); sampler takes {} / 'uniform'; every other part is refused saying why."""
    from ding_buffer import create_buffer

    def frag(worker, fid):
        return dict(worker=worker, fid=fid, model_version=0, data={'obs': torch.zeros(2)})

    def uses_until_gone(cfg):
        buf = create_buffer(dict(type='chunk', fragments_per_chunk=1, seed=0, max_staleness=None, **cfg))
        buf.push(frag('w', 0))
        n = 0
        while buf.count():
            assert buf.sample(1) is not None
            n += 1
        buf.close()
        return n

    assert uses_until_gone(dict(max_use=3)) == uses_until_gone(dict(max_reuse=3)) == 3
    assert uses_until_gone(dict(max_reuse=5, removers=[dict(type='max_use', max_use=2)])) == 2
    assert uses_until_gone(dict(max_reuse=2, removers=[dict(type='max_use', max_use=4), dict(type='fifo')])) == 2
    assert uses_until_gone(dict(max_reuse=1, sampler=dict(type='uniform'))) == 1
    refused = {
        'removers': [dict(type='lifo')],
        'sampler': dict(type='prioritized'),
        'thruput_controller': dict(push_sample_rate_limit=dict(max=2, min=0)),
    }
    for key, value in refused.items():
        with pytest.raises(ValueError, match=f"config key '{key}'.*expected"):
            create_buffer(dict(type='chunk', **{key: value}))
    with pytest.raises(ValueError, match=r"config key 'removers\[0\]\.max_use' has invalid value 0"):
        create_buffer(dict(type='chunk', removers=[dict(type='max_use', max_use=0)]))
    assert uses_until_gone(dict(max_reuse=5, removers=[dict(type='max_use', max_use=1.5)])) == 2  # use >= 1.5


def test_a_disk_store_checkpoint_of_numpy_payloads_loads_without_pickle(tmp_path):
    """A disk store takes plain data (numpy arrays too) and reads its payload files back without pickle, but the
    buffer's own save_data file of such payloads was refused unless allow_pickle=True."""
    cfg = dict(type='chunk', fragments_per_chunk=1, seed=0, store=dict(type='disk', path=str(tmp_path / 'a')))
    buf = create_buffer(cfg)
    buf.push(frag(0, 0, 0, data={'obs': np.arange(3, dtype=np.float32), 'tag': np.str_('x')}))
    buf.save_data(str(tmp_path / 'ckpt.pt'))
    other = create_buffer(dict(cfg, store=dict(type='disk', path=str(tmp_path / 'b'))))
    other.load_data(str(tmp_path / 'ckpt.pt'))
    (got,) = other.sample(1)
    assert np.array_equal(got['data']['obs'], np.arange(3, dtype=np.float32)) and got['data']['tag'] == 'x'


def test_files_keep_their_checksums_while_torch_is_told_to_write_none(tmp_path):
    """``torch.serialization.set_crc32_options(False)`` is torch's own switch: a buffer file or a fragment file
    written meanwhile had no CRC-32, so every read (which checks them) refused it. They are written with them."""
    cfg = dict(type='chunk', max_reuse=None, seed=0, store=dict(type='disk', path=str(tmp_path / 's')))
    naive = create_buffer(dict(type='naive', replay_buffer_size=4))
    naive.push([{'obs': i} for i in range(3)])
    buf = create_buffer(cfg)
    torch.serialization.set_crc32_options(False)
    try:
        buf.push(dict(worker='w', fid=0, model_version=0, data={'x': torch.arange(4)}))
        naive.save_data(str(tmp_path / 'naive.pt'))
        buf.save_data(str(tmp_path / 'chunk.pt'))
    finally:
        torch.serialization.set_crc32_options(True)
    assert buf.sample(1)[0]['data']['x'].tolist() == [0, 1, 2, 3]
    other = create_buffer(dict(type='naive', replay_buffer_size=4))
    other.load_data(str(tmp_path / 'naive.pt'))
    assert other.count() == 3
    create_buffer(dict(cfg, store=dict(type='disk', path=str(tmp_path / 't')))).load_data(str(tmp_path / 'chunk.pt'))


@pytest.mark.parametrize('edit', ['version', 'session', 'misspelt', 'engine counter', 'uid', 'orphan payload'])
def test_a_saved_chunk_whose_entries_disagree_with_its_fragments_is_refused(edit):
    """A chunk's version and session are its fragments': a state that says otherwise (or names an entry that no
    chunk has) is damaged, not loaded with the value replaced."""
    cfg = dict(type='chunk', fragments_per_chunk=2, seed=0, max_chunks=4)
    buf = create_buffer(cfg)
    for w in (0, 1):
        for fid in range(2):
            buf.push(frag(w, fid, 0))
    state = buf.state_dict()
    chunk = state['chunks'][0]
    if edit == 'misspelt':
        chunk['versyon'] = chunk.pop('version')
    elif edit == 'engine counter':  # the engine's copy of the table's chunks_left
        state['engine']['counters']['remove_count'] = 7
    elif edit == 'uid':  # uids are handed out from next_uid
        chunk['uid'] = 129
    elif edit == 'orphan payload':  # a queue lost: its payload is no fragment's
        state['payloads']['x'] = next(iter(state['payloads'].values()))
    else:
        chunk[edit] = 7 if edit == 'version' else 'other'
    fresh = create_buffer(cfg)
    before = fresh.state_dict()
    with pytest.raises(ValueError, match='chunk|remove_count|payload'):
        fresh.load_state_dict(state)
    assert_same(fresh.state_dict(), before)


def test_two_buffers_on_one_disk_store_keep_each_others_payloads(tmp_path):
    """A buffer loaded from another's file on the same disk path (the persistence round trip) shares its payload
    files: one releasing a chunk, or starting (``clear_on_start``), deletes no file the other still refers to; a
    file neither refers to goes."""
    cfg = dict(type='chunk', max_chunks=4, fragments_per_chunk=1, max_reuse=1, seed=0)
    cfg['store'] = dict(type='disk', path=str(tmp_path / 'store'))
    a = create_buffer(cfg)
    a.push([frag(0, k, 0) for k in range(2)])
    a.save_data(str(tmp_path / 'a.pt'))
    os.symlink(tmp_path / 'store', tmp_path / 'link')  # the same directory by another path
    b = create_buffer(dict(cfg, store=dict(type='disk', path=str(tmp_path / 'link'))))  # clear_on_start: a's stay
    b.load_data(str(tmp_path / 'a.pt'))
    assert sorted(f['fid'] for f in b.sample(2)) == [0, 1]  # max_reuse=1: b's chunks leave
    b.push(frag(0, 2, 0))
    b.sample(1)  # b lets go of the payloads of its last fetch
    assert sorted(f['fid'] for f in a.sample(2)) == [0, 1]  # a's are all there
    a.save_data(str(tmp_path / 'a2.pt'))
    a.close()
    b.clear()
    left = [n for n in os.listdir(tmp_path / 'store') if n.endswith('.pt')]
    assert len(left) == 2  # a's last fetch (a closed: its payloads stay in the store, as documented)
    c = create_buffer(cfg)  # no open buffer refers to them: a new one starts empty
    assert not [n for n in os.listdir(tmp_path / 'store') if n.endswith('.pt')]
    c.close()


@pytest.mark.parametrize(
    'leaf',
    [
        np.rec.array([(1, 2.0)], dtype=[('a', 'i4'), ('b', 'f8')]),
        np.ma.masked_array([1.0, 2.0], mask=[False, True]),
        np.asmatrix(np.eye(2)),
        np.rec.array([(1, 2.0)], dtype=[('a', 'i4'), ('b', 'f8')])[0],
        np.array([1, 'a'], dtype=object),
    ],
    ids=['recarray', 'masked', 'matrix', 'record', 'object'],
)
def test_a_disk_store_refuses_at_push_the_numpy_values_its_files_cannot_read_back(leaf, tmp_path):
    """Subclasses of numpy's array and scalar pickle as themselves, which a payload file does not read back: such a
    push was accepted, and every later sample, state_dict and save_data failed."""
    buf = create_buffer(dict(type='chunk', fragments_per_chunk=1, seed=0, store=dict(type='disk', path=str(tmp_path))))
    buf.push(frag(0, 0, 0, data={'obs': np.zeros(2), 'rec': np.zeros(2, dtype=[('a', 'i4')])[0]}))
    before = buf.state_dict()
    with pytest.raises(TypeError, match=r"data\['obs'\] holds a"):
        buf.push(frag(0, 1, 0, data={'obs': leaf}))
    assert_same(buf.state_dict(), before)
    assert buf.sample(1)[0]['fid'] == 0


class _Phase(enum.IntEnum):
    TRAIN = 1


class _Sub(torch.Tensor):
    pass


def _with_attribute(t, value):
    t.info = value  # (saved with the tensor, read back by the same rules)
    return t


@pytest.mark.parametrize(
    'payload',
    [
        EasyDict(obs=torch.zeros(2)),
        collections.defaultdict(list, obs=torch.zeros(2)),
        collections.namedtuple('Pair', 'obs reward')(torch.zeros(2), 1.0),
        {'obs': torch.zeros(2), 'info': EasyDict(x=1)},
        {'obs': torch.zeros(2), 'phase': _Phase.TRAIN},
        {'obs': torch.zeros(2).as_subclass(_Sub)},
        {_Phase.TRAIN: torch.zeros(2)},
        {'obs': np.zeros(2, dtype=[('a', 'i4'), ('b', object)])},
        {'obs': _with_attribute(torch.zeros(2), collections.defaultdict(int))},
    ],
    ids=[
        'easydict',
        'defaultdict',
        'namedtuple',
        'nested-easydict',
        'intenum-leaf',
        'tensor-subclass',
        'enum-key',
        'object-field',
        'tensor-attribute',
    ],
)
def test_a_disk_store_refuses_at_push_the_subclasses_its_files_cannot_read_back(payload, tmp_path):
    """A payload file reads back exactly dicts, lists, tuples and plain leaves; a subclass (an EasyDict, a namedtuple,
    an IntEnum) pickles as itself. Such a push was accepted, then every sample of its chunk and every save_data
    failed, naming the file unreadable. The memory store keeps them."""
    buf = create_buffer(dict(type='chunk', fragments_per_chunk=1, seed=0, store=dict(type='disk', path=str(tmp_path))))
    buf.push(frag(0, 0, 0, data={'obs': torch.ones(2), 'od': OrderedDict(a=1), 'shape': torch.Size([2])}))
    before = buf.state_dict()
    with pytest.raises(TypeError, match=r"fragment 0 data.* (holds a|has a key of type)"):
        buf.push(frag(0, 1, 0, data=payload))
    assert_same(buf.state_dict(), before)
    assert buf.sample(1)[0]['data']['od'] == OrderedDict(a=1)
    buf.save_data(str(tmp_path / 'x.pt'))
    if not isinstance(payload, dict) or type(payload.get('obs')) is torch.Tensor:  # (a bare subclass cannot be copied)
        kept = create_buffer(dict(type='chunk', fragments_per_chunk=1, seed=0))
        kept.push(frag(0, 0, 0, data=payload))
        assert type(kept.sample(1)[0]['data']) is type(payload)


def test_a_disk_store_keeps_numpy_string_keys_and_tensor_attributes_of_plain_values(tmp_path):
    """What a payload file reads back is kept: numpy string keys (np.unique's) and a tensor's plain attributes."""
    cfg = dict(type='chunk', fragments_per_chunk=1, seed=0, store=dict(type='disk', path=str(tmp_path / 'a')))
    buf = create_buffer(cfg)
    keys = np.unique(np.array(['obs', 'act']))
    t = _with_attribute(torch.ones(2), {'tag': 1})
    buf.push(frag(0, 0, 0, data={keys[0]: torch.zeros(1), keys[1]: t}))
    buf.save_data(str(tmp_path / 'x.pt'))
    again = create_buffer(dict(cfg, store=dict(type='disk', path=str(tmp_path / 'b'))))
    again.load_data(str(tmp_path / 'x.pt'))
    data = again.sample(1)[0]['data']
    assert sorted(data) == ['act', 'obs'] and data['obs'].info == {'tag': 1}


@pytest.mark.parametrize('store', ['memory', 'disk'])
def test_payload_tensors_that_require_grad_come_back_as_data_a_learner_may_edit(store, tmp_path):
    """A payload is data: a sampled copy of a tensor that required grad (a leaf, or ``w * 2`` inside a graph) is
    detached, so the documented in-place edit works; the pushed tensors keep their graph."""
    spec = dict(type='memory') if store == 'memory' else dict(type='disk', path=str(tmp_path / 'store'))
    buf = create_buffer(dict(type='chunk', max_chunks=8, fragments_per_chunk=1, store=spec, seed=0))
    w = torch.ones(3, requires_grad=True)
    for fid, x in enumerate([w, w * 2]):
        buf.push(dict(worker='w0', fid=fid, model_version=0, session_id='s', data={'x': x, 'n': [x]}))
    out = [f['data'] for f in buf.sample(2)]
    assert sorted(d['x'].tolist() for d in out) == [[1.0] * 3, [2.0] * 3]
    for d in out:
        assert not d['x'].requires_grad and not d['n'][0].requires_grad
        d['x'].mul_(0)
    assert w.requires_grad and w.tolist() == [1.0] * 3
    assert sorted(f['data']['x'].tolist() for f in buf.sample(2)) == [[1.0] * 3, [2.0] * 3]
    buf.close()


def test_a_memory_payload_holding_a_cycle_or_shared_lists_is_copied_once_each():
    """The walk that detaches tensors visited a cyclic list for ever and a list shared by many parents once per
    path (2**depth); deepcopy, which copies each object once, took both."""
    buf = create_buffer(dict(type='chunk', max_chunks=4, fragments_per_chunk=1, seed=0))
    loop = [torch.ones(2)]
    loop.append(loop)
    shared = [torch.zeros(1)]
    for _ in range(40):
        shared = [shared, shared]
    buf.push(dict(worker='w', fid=0, model_version=0, session_id='s', data={'loop': loop, 'shared': shared}))
    data = buf.sample(1)[0]['data']
    assert data['loop'][1] is data['loop'] and data['loop'][0].tolist() == [1.0, 1.0]
    assert data['shared'][0] is data['shared'][1]
