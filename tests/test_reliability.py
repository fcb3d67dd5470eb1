"""Regression tests of issue 14: nothing accepted may break a later call, a failing call changes nothing and
names what was wrong. One test (or parametrized group) per defect, through the public API."""

import contextlib
import copy
import errno
import gc
import logging
import os
import resource
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest
import torch
from helpers import assert_same

from ding_buffer import SampleTimeoutError, create_buffer


def advanced(storage='list', **kw):
    return create_buffer(dict(type='advanced', replay_buffer_size=8, seed=0, storage=dict(type=storage), **kw))


def item(i, **extra):
    return {'obs': torch.tensor([float(i), 0.0]), **extra}


# ------------------------------------------------------------------------------------------ 1. collect_iter
@pytest.mark.parametrize('bad', ['abc', 2**70, float('nan'), True, b'x', {'a': 1}, float('inf')])
@pytest.mark.parametrize('batched', [False, True])
def test_bad_collect_iter_is_refused_at_push_and_later_samples_work(bad, batched):
    buf = advanced()
    buf.push([item(i, collect_iter=i) for i in range(4)])
    before = buf.state_dict()
    with pytest.raises(ValueError, match='collect_iter'):
        if batched:
            buf.push({'obs': torch.zeros(2, 2), 'collect_iter': [1, bad]}, batched=True)
        else:
            buf.push([item(9, collect_iter=3), item(10, collect_iter=bad)])
    assert_same(buf.state_dict(), before)
    assert len(buf.sample(4, cur_learner_iter=5)) == 4


@pytest.mark.parametrize('fine', [[3, 4], (3, 4), np.array([3, 4]), torch.tensor([3, 4]), np.int64(3), 3.0])
def test_sequence_collect_iter_counts_its_oldest_step(fine):
    buf = advanced()
    buf.push(item(0, collect_iter=fine))
    assert buf.sample(1, cur_learner_iter=10)[0]['staleness'] == 7


# ------------------------------------------------------------------------------------------ 2. priorities
@pytest.mark.parametrize('storage', ['list', 'tensor'])
@pytest.mark.parametrize('bad', [1e39, float('inf'), 10**400, '1.5', True, 1 + 2j, -1.0, float('nan')])
def test_priority_outside_float32_or_not_a_real_number_is_refused(storage, bad):
    buf = advanced(storage)
    buf.push([item(i) for i in range(4)])
    before = buf.state_dict()
    with pytest.raises((TypeError, ValueError), match='priority'):
        buf.push(item(5, priority=bad))
    out = buf.sample(4)
    ids = out['replay_unique_id'] if storage == 'tensor' else [x['replay_unique_id'] for x in out]
    idx = out['replay_buffer_idx'] if storage == 'tensor' else [x['replay_buffer_idx'] for x in out]
    before = buf.state_dict()
    with pytest.raises((TypeError, ValueError), match='priority'):
        buf.update({'replay_unique_id': ids, 'replay_buffer_idx': idx, 'priority': [1.0, 1.0, 1.0, bad]})
    assert_same(buf.state_dict(), before)


def test_bool_and_complex_priority_tensors_are_refused():
    buf = advanced('tensor')
    buf.push([item(i) for i in range(4)])
    out = buf.sample(2)
    for bad in (torch.tensor([True, False]), torch.tensor([1 + 1j, 2 + 0j])):
        with pytest.raises(TypeError, match='priority'):
            buf.update(
                {
                    'replay_unique_id': out['replay_unique_id'],
                    'replay_buffer_idx': out['replay_buffer_idx'],
                    'priority': bad,
                }
            )


def test_largest_float32_priority_survives_save_and_load(tmp_path):
    buf = advanced('tensor')
    buf.push(item(0, priority=float(np.finfo(np.float32).max)))
    buf.save_data(str(tmp_path / 'b.pt'))
    other = advanced('tensor')
    other.load_data(str(tmp_path / 'b.pt'))
    assert other.count() == 1 and torch.isfinite(other.sample(1)['priority']).all()


@pytest.mark.parametrize('alpha', [1e-9, 1e-6, 0.6, 1.0])
@pytest.mark.parametrize('storage', ['list', 'tensor'])
def test_largest_float32_priority_at_any_alpha_samples_finite_and_round_trips(alpha, storage):
    """A small alpha magnifies the last bit of a leaf (priority ** alpha): the priority it stands for may round
    above float32's largest. Pushed, updated and after a save and load it reads as that largest value, never inf."""
    top = float(np.finfo(np.float32).max)
    buf = advanced(storage, alpha=alpha)
    buf.push([item(0, priority=top), item(1, priority=1.0)])
    got = buf.sample(2)
    keys = ('replay_unique_id', 'replay_buffer_idx')
    info = {k: got[k] if storage == 'tensor' else [x[k] for x in got] for k in keys}
    buf.update({**info, 'priority': [top, top]})
    for b in (buf, advanced(storage, alpha=alpha)):
        b.load_state_dict(buf.state_dict())
        got = b.sample(2)
        prios = got['priority'].tolist() if storage == 'tensor' else [x['priority'] for x in got]
        assert prios == [top, top], prios


# ------------------------------------------------------------------------------------------ 3. iteration args
@pytest.mark.parametrize('btype', ['naive', 'advanced', 'episode', 'gfn'])
@pytest.mark.parametrize('bad', [None, 'x', 1.5, True, 2**70])
def test_bad_learner_iter_or_envstep_is_refused_before_anything_changes(btype, bad):
    if btype in ('gfn',):
        buf = create_buffer(dict(type=btype, replay_buffer_size=8, seed=0))
        data = {'state': torch.randn(4, 3), 'log_reward': torch.zeros(4)}
    elif btype == 'episode':
        buf = create_buffer(dict(type=btype, replay_buffer_size=8, seed=0))
        data = [[{'x': i} for i in range(3)] for _ in range(4)]
    else:
        buf = create_buffer(dict(type=btype, replay_buffer_size=8, seed=0))
        data = [item(i) for i in range(4)]
    buf.push(data)
    before = buf.state_dict()
    with pytest.raises((TypeError, ValueError), match='cur_learner_iter'):
        buf.sample(2, cur_learner_iter=bad)
    with pytest.raises((TypeError, ValueError), match='cur_collector_envstep'):
        buf.push(data, cur_collector_envstep=bad)
    assert_same(buf.state_dict(), before)
    assert buf.sample(2, cur_learner_iter=np.int64(3)) is not None  # numpy ints are ints


@pytest.mark.parametrize(
    'kwargs, key',
    [
        (dict(timeout='1'), 'timeout'),
        (dict(timeout=-1), 'timeout'),
        (dict(timeout=float('nan')), 'timeout'),
        (dict(timeout=True), 'timeout'),
        (dict(replace='no'), 'replace'),
    ],
)
def test_bad_sample_arguments_name_the_argument(kwargs, key):
    buf = create_buffer(dict(type='naive', replay_buffer_size=8, seed=0))
    buf.push([item(i) for i in range(4)])
    before = buf.state_dict()
    with pytest.raises((TypeError, ValueError), match=key):
        buf.sample(2, **kwargs)
    assert_same(buf.state_dict(), before)


@pytest.mark.parametrize(
    'kwargs, key',
    [(dict(unroll_len=True), 'unroll_len'), (dict(replace='no'), 'replace'), (dict(unroll_len=2, pad='yes'), 'pad')],
)
def test_bad_episode_sample_arguments_name_the_argument(kwargs, key):
    buf = create_buffer(dict(type='episode', replay_buffer_size=8, seed=0))
    buf.push([[{'x': i} for i in range(3)] for _ in range(4)])
    with pytest.raises((TypeError, ValueError), match=key):
        buf.sample(2, **kwargs)


# ------------------------------------------------------------------------------------------ 4. rate limiter
def _stalls(rng, lo, hi, push_n, sample_n, storage, rounds=300):
    """Alternate pushes and samples; a stall is a round where both are refused."""
    buf = create_buffer(
        dict(
            type='naive',
            replay_buffer_size=64,
            seed=0,
            storage=dict(type=storage),
            thruput_controller=dict(
                push_sample_rate_limit=dict(min=lo, max=hi), window_seconds=3600.0, sample_min_limit_ratio=1.0
            ),
        )
    )
    stalls, progress = 0, 0
    for k in range(rounds):
        pushed = buf.push([item(i) for i in range(push_n)])
        sampled = buf.sample(sample_n, replace=True) is not None
        stalls += not pushed and not sampled
        progress += bool(pushed) + sampled
    return stalls, progress


@pytest.mark.parametrize('seed', range(6))
def test_rate_limiter_never_stalls_over_many_settings(seed):
    """Simulation over random settings, including the issue's (min = max = 1, pushes of 8, samples of 32)."""
    rng = np.random.default_rng(seed)
    cases = [(1.0, 1.0, 8, 32), (0.9, 1.1, 8, 32)] if seed == 0 else []
    for _ in range(8):
        lo = float(rng.uniform(0, 3))
        cases.append(
            (lo, lo + float(rng.choice([0.0, 0.05, 0.5, 2.0])), int(rng.integers(1, 33)), int(rng.integers(1, 33)))
        )
    for lo, hi, push_n, sample_n in cases:
        stalls, progress = _stalls(rng, lo, hi, push_n, sample_n, 'tensor' if seed % 2 else 'list')
        assert stalls == 0, (lo, hi, push_n, sample_n)
        assert progress >= 300


def test_rate_limiter_still_bounds_the_ratio_when_it_can():
    buf = create_buffer(
        dict(
            type='naive',
            replay_buffer_size=64,
            seed=0,
            storage=dict(type='tensor'),
            thruput_controller=dict(
                push_sample_rate_limit=dict(min=0.0, max=2.0), window_seconds=3600.0, sample_min_limit_ratio=1.0
            ),
        )
    )
    buf.push([item(i) for i in range(8)])
    assert buf.sample(8) is not None  # pushed 8, sampled 8
    assert buf.push([item(i) for i in range(8)]) == 8  # (8 + 8) / 8 = 2 <= 2
    assert buf.push([item(i) for i in range(8)]) == 0  # 24 / 8 > 2, and a sample is possible: refused
    assert buf.stats()['refused_push'] == 1


# ------------------------------------------------------------------------------------------ 5. episode fields
@pytest.mark.parametrize(
    'storage, field',
    [('tensor', 'mask'), ('tensor', 'start'), ('tensor', 'episode_id'), ('tensor', 'episode_idx'), ('list', 'mask')],
)
def test_episode_fields_that_windows_add_are_refused(storage, field):
    buf = create_buffer(
        dict(type='episode', replay_buffer_size=4, max_transitions=40, seed=0, storage=dict(type=storage))
    )
    with pytest.raises(ValueError, match=field):
        buf.push({'obs': torch.zeros(5, 2), field: torch.zeros(5)})
    assert buf.count() == 0
    buf.push({'obs': torch.zeros(5, 2)})
    assert buf.sample(2, unroll_len=3, replace=True) is not None


def test_prioritized_windows_also_reserve_priority_and_is():
    buf = create_buffer(
        dict(type='prioritized_episode', replay_buffer_size=4, max_transitions=40, sampler=dict(unroll_len=3))
    )
    for field in ('priority', 'IS'):
        with pytest.raises(ValueError, match=field):
            buf.push({'obs': torch.zeros(5, 2), field: torch.zeros(5)})


# ------------------------------------------------------------------------------------------ 6. bit flips
@pytest.mark.parametrize('btype', ['naive', 'advanced', 'episode', 'gfn', 'gfn_diverse', 'terminating_state'])
def test_no_single_bit_flip_of_a_save_loads_other_data(btype, tmp_path):
    """120 random single-bit flips over the whole file: each is refused (ValueError) or loads the very same state."""
    if btype.startswith(('gfn', 'term')):
        buf = create_buffer(dict(type=btype, replay_buffer_size=8, seed=0))
        buf.push({'state': torch.randn(6, 3, generator=torch.Generator().manual_seed(1)), 'log_reward': torch.randn(6)})
    elif btype == 'episode':
        buf = create_buffer(
            dict(type=btype, replay_buffer_size=4, max_transitions=30, seed=0, storage=dict(type='tensor'))
        )
        buf.push([{'obs': torch.randn(5, 2)} for _ in range(3)])
    else:
        buf = create_buffer(dict(type=btype, replay_buffer_size=8, seed=0, storage=dict(type='tensor')))
        buf.push([item(i, collect_iter=i) for i in range(6)])
    path = tmp_path / 'b.pt'
    buf.save_data(str(path))
    raw = bytearray(path.read_bytes())
    want = buf.state_dict()
    rng = np.random.default_rng(0)
    damaged = tmp_path / 'd.pt'
    for pos in rng.integers(0, len(raw), 120).tolist():
        flipped = bytearray(raw)
        flipped[pos] ^= 1 << int(rng.integers(0, 8))
        damaged.write_bytes(bytes(flipped))
        other = copy.deepcopy(buf) if False else None  # noqa: F841 (a fresh buffer each time below)
        fresh = create_buffer(dict(buf.cfg, seed=0))
        try:
            fresh.load_data(str(damaged))
        except ValueError:
            continue
        assert_same(fresh.state_dict(), want, f'flip at byte {pos} loaded other data')


# ------------------------------------------------------------------------------------------ 7. killed saves
@pytest.mark.parametrize('btype', ['naive', 'advanced'])
def test_items_holding_expanded_tensors_round_trip_through_a_file(btype, tmp_path):
    """List storage keeps pushed objects as they are, expanded (stride 0) tensors and unfolded frame stacks
    included: its own file must load back."""
    cfg = dict(type=btype, replay_buffer_size=4, storage=dict(type='list'), deepcopy=True, seed=0)
    buf = create_buffer(cfg)
    buf.push({'obs': torch.ones(3), 'reward': torch.tensor(1.0).expand(3), 'stack': torch.arange(8.0).unfold(0, 4, 1)})
    path = str(tmp_path / 'buffer.pt')
    buf.save_data(path)
    other = create_buffer(cfg)
    other.load_data(path)
    assert_same(other.state_dict(), buf.state_dict())


def test_next_save_removes_temporary_files_of_killed_saves(tmp_path):
    buf = advanced('tensor')
    buf.push([item(i) for i in range(4)])
    host = socket.gethostname().replace('.', '_')
    dead = tmp_path / f'.b.pt.{host}.999999999.abc123.tmp'  # a writer process that is gone
    live = tmp_path / f'.b.pt.{host}.1.abc123.tmp'  # pid 1 is running: not ours to remove
    foreign = tmp_path / '.b.pt.someone_else.tmp'  # not a name this package gives
    for f in (dead, live, foreign):
        f.write_bytes(b'x' * 100)
    old = tmp_path / '.b.pt.otherhost.12.abc.tmp'
    old.write_bytes(b'x')
    os.utime(old, (time.time() - 2 * 86400, time.time() - 2 * 86400))  # older than a day, any host
    buf.save_data(str(tmp_path / 'b.pt'))
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(['b.pt', live.name, foreign.name])


@contextlib.contextmanager
def file_size_limit(nbytes):
    """Writes past ``nbytes`` of any file fail with ``OSError(EFBIG)``, as writes to a full disk fail (ENOSPC)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


@pytest.mark.parametrize('storage', ['list', 'tensor'])
def test_a_save_that_runs_out_of_room_names_the_file_and_keeps_the_old_one(storage, tmp_path):
    buf = create_buffer(dict(type='advanced', replay_buffer_size=4096, seed=0, storage=dict(type=storage)))
    buf.push([item(i) for i in range(8)])
    path = str(tmp_path / 'b.pt')
    buf.save_data(path)
    buf.push([item(i) for i in range(4000)])
    before = buf.state_dict()
    with file_size_limit(os.path.getsize(path) + 4096), pytest.raises(OSError) as err:
        buf.save_data(path)
    assert err.value.errno == errno.EFBIG and err.value.filename == path
    assert os.listdir(tmp_path) == ['b.pt']  # no temporary file left
    assert_same(buf.state_dict(), before)
    old = create_buffer(dict(type='advanced', replay_buffer_size=4096, storage=dict(type=storage)))
    old.load_data(path, allow_pickle=storage == 'list')
    assert old.count() == 8
    buf.save_data(path)  # room again: the same buffer saves
    old.load_data(path, allow_pickle=storage == 'list')
    assert old.count() == 4008


def test_a_directory_fsync_that_fails_after_the_rename_warns_and_the_save_stands(tmp_path, monkeypatch, caplog):
    """The new file is in place once renamed: a failing directory fsync (EIO, EMFILE) does not make the save one
    that failed (which promises the old file), it warns."""
    path = str(tmp_path / 'b.pt')
    buf = create_buffer(dict(type='naive', replay_buffer_size=16, seed=0, storage=dict(type='tensor')))
    buf.push(item(0))
    buf.save_data(path)
    buf.push([item(i) for i in range(1, 5)])
    real = os.fsync

    def fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EIO, 'Input/output error')
        return real(fd)

    monkeypatch.setattr(os, 'fsync', fsync)
    with caplog.at_level(logging.WARNING, logger='ding_buffer'):
        buf.save_data(path)
    monkeypatch.setattr(os, 'fsync', real)
    assert 'fsync of its directory failed' in caplog.text
    other = create_buffer(dict(type='naive', replay_buffer_size=16, storage=dict(type='tensor')))
    other.load_data(path)
    assert_same(other.state_dict(), buf.state_dict())
    assert os.listdir(tmp_path) == ['b.pt']


def test_a_text_file_that_runs_out_of_room_names_the_file_and_keeps_the_old_one(tmp_path):
    """The training jobs' eval.csv / summary.json: written as the buffer files are."""
    from ding_buffer.persistence import atomic_text

    path = str(tmp_path / 'eval.csv')
    atomic_text('step,return\n', path)
    with file_size_limit(64), pytest.raises(OSError) as err:
        atomic_text('step,return\n' + '1,2\n' * 100, path)
    assert err.value.errno == errno.EFBIG and err.value.filename == path
    assert os.listdir(tmp_path) == ['eval.csv'] and open(path).read() == 'step,return\n'


def test_a_chunk_disk_store_that_runs_out_of_room_names_the_file_and_keeps_the_buffer(tmp_path):
    store = tmp_path / 'store'
    buf = create_buffer(dict(type='chunk', fragments_per_chunk=2, store=dict(type='disk', path=str(store))))
    frag = dict(worker='w', fid=0, model_version=0, session_id='s', data={'obs': torch.zeros(16, 128)})
    buf.push(frag)
    before = buf.state_dict()
    with file_size_limit(4096), pytest.raises(OSError) as err:
        buf.push(dict(frag, fid=1, data={'obs': torch.ones(16, 128)}))
    assert err.value.errno == errno.EFBIG and os.path.dirname(err.value.filename) == str(store)
    assert not [n for n in os.listdir(store) if n.endswith('.tmp')]
    assert_same(buf.state_dict(), before)
    buf.push(dict(frag, fid=1, data={'obs': torch.ones(16, 128)}))
    assert [f['data']['obs'].sum().item() for f in buf.sample(2)] == [0.0, 16 * 128]  # one chunk, in order
    buf.close()


def test_a_long_file_name_a_symlink_and_a_bytes_path_save_as_open_would_write_them(tmp_path):
    buf = advanced('tensor')
    buf.push([item(i) for i in range(3)])
    long = tmp_path / ('n' * 250 + '.pt')  # (255 bytes at most: the temporary file's name must fit too)
    buf.save_data(str(long))
    target = tmp_path / 'real.pt'
    (tmp_path / 'link.pt').symlink_to(target)
    buf.save_data(str(tmp_path / 'link.pt'))  # the link's target gets the file; the link stays
    buf.save_data(os.fsencode(tmp_path / 'bytes.pt'))
    assert (tmp_path / 'link.pt').is_symlink()
    for path in (str(long), str(target), os.fsencode(tmp_path / 'bytes.pt')):
        other = advanced('tensor')
        other.load_data(path)
        assert_same(other.state_dict(), buf.state_dict())
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([long.name, 'real.pt', 'link.pt', 'bytes.pt'])


class RaisesWhenSaved:
    """Copied (as a state holds it), but not saved: as a scripted torch module, or a proxy whose connection broke."""

    def __init__(self, error):
        self.error = error

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        raise self.error


@pytest.mark.parametrize(
    'error', [RuntimeError('cannot be saved'), ConnectionResetError(errno.ECONNRESET, 'Connection reset by peer')]
)
def test_an_error_of_the_data_comes_through_a_save_unchanged(error, tmp_path):
    buf = create_buffer(dict(type='naive', replay_buffer_size=4, seed=0))
    buf.push({'obs': RaisesWhenSaved(error)})
    with pytest.raises(type(error)) as err:
        buf.save_data(str(tmp_path / 'b.pt'))
    assert err.value is error and getattr(error, 'filename', None) is None
    try:
        raise FileNotFoundError(2, 'No such file or directory', 'settings.yaml')  # (the caller's own error)
    except OSError:
        with pytest.raises(type(error)) as err:
            buf.save_data(str(tmp_path / 'b.pt'))
    assert err.value is error and getattr(error, 'filename', None) is None
    assert os.listdir(tmp_path) == []


def test_a_directory_or_a_symlink_loop_or_chain_at_the_path_is_named(tmp_path):
    buf = advanced('tensor')
    buf.push(item(0))
    (tmp_path / 'dir.pt').mkdir()
    with pytest.raises(IsADirectoryError) as err:
        buf.save_data(str(tmp_path / 'dir.pt'))
    assert err.value.filename == str(tmp_path / 'dir.pt')
    (tmp_path / 'a.pt').symlink_to(tmp_path / 'b.pt')
    (tmp_path / 'b.pt').symlink_to(tmp_path / 'a.pt')
    with pytest.raises(OSError) as err:
        buf.save_data(str(tmp_path / 'a.pt'))
    assert err.value.errno == errno.ELOOP and err.value.filename == str(tmp_path / 'a.pt')
    assert (tmp_path / 'a.pt').is_symlink() and (tmp_path / 'b.pt').is_symlink()
    (tmp_path / 'd1').symlink_to(tmp_path / 'd2')  # a loop of directories on the way
    (tmp_path / 'd2').symlink_to(tmp_path / 'd1')
    chain = [tmp_path / f'link{k}' for k in range(41)]  # longer than Linux follows (40)
    for k, link in enumerate(chain):
        link.symlink_to(chain[k + 1] if k + 1 < len(chain) else tmp_path / 'real.pt')
    for path in (tmp_path / 'd1' / 'b.pt', chain[0]):
        with pytest.raises(OSError) as err:
            buf.save_data(str(path))
        assert err.value.errno == errno.ELOOP and err.value.filename == str(path)
    buf.save_data(str(chain[1]))  # (40 links: followed, as open follows them)
    other = advanced('tensor')
    other.load_data(str(chain[1]))
    assert_same(other.state_dict(), buf.state_dict())


def test_a_long_file_names_temporary_files_of_killed_saves_are_removed(tmp_path):
    buf = advanced('tensor')
    buf.push(item(0))
    path = str(tmp_path / ('m' * 250 + '.pt'))
    buf.save_data(path)
    pid = os.fork()  # a save killed midway (by SIGXFSZ past a file-size limit): its temporary file stays
    if pid == 0:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        buf.save_data(path)
        os._exit(0)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == -signal.SIGXFSZ
    assert len(os.listdir(tmp_path)) == 2  # the file and the killed save's temporary one
    buf.save_data(path)
    assert os.listdir(tmp_path) == [os.path.basename(path)]


OUT_OF_MEMORY = """
import contextlib, gc, resource, sys, torch
from helpers import assert_same
from ding_buffer import _numba, create_buffer

_numba.load()  # (compiled before the limit: the sample is what must fail)


@contextlib.contextmanager
def memory_limit(extra):  # allocations past ``extra`` bytes more than the process holds now fail (a job's limit)
    gc.collect()
    with open('/proc/self/status') as f:
        held = next(int(line.split()[1]) * 1024 for line in f if line.startswith('VmSize'))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (held + extra, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def refused(call):
    with memory_limit(8 << 20):
        try:
            call()
        except MemoryError as e:
            return str(e)
    raise AssertionError('no MemoryError')


cfg = dict(type=sys.argv[1], replay_buffer_size=10_000, seed=0, storage=dict(type='tensor', output=sys.argv[3]))
cfg.update({'max_use': 1} if cfg['type'] == 'advanced' else {})
buf, twin = create_buffer(cfg), create_buffer(cfg)
items = sys.argv[3] == 'items'  # (small rows: what runs out of memory is making 9000 items of the batch)
buf.extend({'obs': torch.ones(10_000, 4 if items else 2048), 'reward': torch.ones(10_000)})
twin.extend({'obs': torch.ones(10_000, 1), 'reward': torch.ones(10_000)})  # (the draws depend on the count)
before = buf.state_dict()
refused(lambda: buf.sample(9000))  # (a batch of 74 MB; of 9000 dicts)
assert_same(buf.state_dict(), before)
drawn, expected = buf.sample(16), twin.sample(16)  # the draw a buffer that never failed makes
if items:
    drawn, expected = ({k: [x[k] for x in batch] for k in batch[0]} for batch in (drawn, expected))
assert_same({k: v for k, v in drawn.items() if k != 'obs'}, {k: v for k, v in expected.items() if k != 'obs'})
if items:
    sys.exit(print('ok'))
buf.save_data(sys.argv[2])
other = create_buffer(cfg)
assert 'not enough memory to load' in refused(lambda: other.load_data(sys.argv[2]))
other.load_data(sys.argv[2])
assert_same(other.state_dict(), buf.state_dict())
print('ok')
"""


@pytest.mark.parametrize(
    'btype,output', [('advanced', 'batch'), ('naive', 'batch'), ('elastic', 'batch'), ('advanced', 'items')]
)
def test_a_sample_or_load_that_runs_out_of_memory_changes_nothing(btype, output, tmp_path):
    """In a process of its own: the memory limit counts the address space, which other tests' garbage may free."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), os.environ.get('PYTHONPATH', '')]))
    run = subprocess.run(
        [sys.executable, '-c', OUT_OF_MEMORY, btype, str(tmp_path / 'b.pt'), output],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert run.returncode == 0 and run.stdout.strip() == 'ok', run.stderr[-3000:]


def test_a_chunk_payload_the_disk_will_not_delete_stays_with_a_warning_and_the_buffer_goes_on(
    tmp_path, monkeypatch, caplog
):
    """A payload no longer held that the filesystem will not delete (EIO, EACCES) is left on disk, logged: the
    clear, the load, the evicting push all complete (warnings raised as errors too), and every later call works."""
    store = tmp_path / 'store'
    cfg = dict(type='chunk', max_chunks=2, fragments_per_chunk=2, seed=0, store=dict(type='disk', path=str(store)))
    buf = create_buffer(cfg)
    for k in range(4):
        buf.push(dict(worker='w', fid=k, model_version=0, session_id='s', data={'obs': torch.full((2,), float(k))}))
    saved = buf.state_dict()
    real, calls = os.remove, []

    def remove(path):
        calls.append(path)
        if len(calls) % 2 == 0:
            raise OSError(errno.EIO, 'Input/output error', path)
        return real(path)

    monkeypatch.setattr(os, 'remove', remove)
    with caplog.at_level(logging.WARNING, logger='ding_buffer'), warnings.catch_warnings():
        warnings.simplefilter('error')
        for k in range(4, 6):  # the oldest chunk leaves
            buf.push(dict(worker='w', fid=k, model_version=0, session_id='s', data={'obs': torch.full((2,), float(k))}))
        assert sorted(f['data']['obs'][0].item() for f in buf.sample(4)) == [2.0, 3.0, 4.0, 5.0]
        buf.load_state_dict(saved)
        assert sorted(f['data']['obs'][0].item() for f in buf.sample(4)) == [0.0, 1.0, 2.0, 3.0]
        buf.clear()
    monkeypatch.setattr(os, 'remove', real)
    assert caplog.text.count('stays on disk') >= 3  # (every other delete failed)
    assert buf.count() == 0 and buf.stats()['chunks_left'] == 2  # (the loaded state's two chunks)
    buf.state_dict()
    buf.push(dict(worker='w', fid=6, model_version=0, session_id='s', data={'obs': torch.zeros(2)}))
    buf.push(dict(worker='w', fid=7, model_version=0, session_id='s', data={'obs': torch.ones(2)}))
    assert [f['data']['obs'][0].item() for f in buf.sample(2)] == [0.0, 1.0]
    buf.close()


def test_a_gflownet_clear_that_runs_out_of_memory_changes_nothing(monkeypatch):
    buf = create_buffer(dict(type='gfn', replay_buffer_size=5, seed=0))
    buf.push({'state': torch.arange(10.0).reshape(5, 2), 'log_reward': torch.zeros(5)})
    before = buf.state_dict()
    real = np.arange

    def arange(*args, **kwargs):
        raise MemoryError('Unable to allocate')

    monkeypatch.setattr(np, 'arange', arange)
    with pytest.raises(MemoryError):
        buf.clear()
    monkeypatch.setattr(np, 'arange', real)
    assert_same(buf.state_dict(), before)
    buf.push({'state': torch.tensor([[7.0, 7.0]]), 'log_reward': torch.zeros(1)})
    assert buf.count() == 5


@pytest.mark.parametrize('btype', ['naive', 'advanced'])
def test_a_push_whose_copy_to_the_device_runs_out_of_memory_changes_nothing(btype, monkeypatch):
    """The copy of a pushed column to the storage's device (every column on CUDA; here a bfloat16 one, which has no
    numpy view on the CPU) comes before the ring moves: an out-of-memory error there fails the push alone."""
    buf = create_buffer(dict(type=btype, replay_buffer_size=4, storage=dict(type='tensor'), seed=0))
    real = torch.Tensor.to

    def to(self, *args, **kwargs):
        raise torch.OutOfMemoryError('CUDA out of memory')

    for first in (True, False):  # the first push (which also allocates the fields), then one into a full buffer
        before = buf.state_dict()
        monkeypatch.setattr(torch.Tensor, 'to', to)
        with pytest.raises(torch.OutOfMemoryError):
            buf.push(
                [{'obs': torch.full((2,), 100.0 + t, dtype=torch.bfloat16), 'reward': 100.0 + t} for t in range(2)]
            )
        monkeypatch.setattr(torch.Tensor, 'to', real)
        assert_same(buf.state_dict(), before)
        if first:
            buf.push([{'obs': torch.full((2,), float(t), dtype=torch.bfloat16), 'reward': float(t)} for t in range(4)])
    batch = buf.sample(4)
    assert sorted(batch['replay_unique_id'].tolist()) == [0, 1, 2, 3]
    assert sorted(batch['obs'][:, 0].tolist()) == [0.0, 1.0, 2.0, 3.0]


# ------------------------------------------------------------------------------------------ 9. memmap files
def test_memmap_files_go_with_their_storage_and_a_rejected_load_leaves_the_live_files(tmp_path):
    d = tmp_path / 'mm'
    cfg = dict(type='naive', replay_buffer_size=8, seed=0, storage=dict(type='tensor', memmap_dir=str(d)))
    buf = create_buffer(cfg)
    buf.push([item(i) for i in range(6)])
    files = sorted(os.listdir(d))
    state = buf.state_dict()
    bad = copy.deepcopy(state)
    bad['storage']['fields'][0][0, 0] = 123.0  # data fine, ring then made inconsistent
    bad['storage']['ring']['head'] = 7
    with pytest.raises(ValueError):
        buf.load_state_dict(bad)
    gc.collect()
    assert sorted(os.listdir(d)) == files  # the live buffer's files, untouched
    assert buf.sample(6)['obs'][:, 0].sort().values.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    buf.load_state_dict(state)  # a successful restore maps new files; the old ones go
    gc.collect()
    assert len(os.listdir(d)) == len(files) and sorted(os.listdir(d)) != files
    buf.close()
    assert os.listdir(d) == []  # close() removes them (the data stays readable)
    assert buf.state_dict()['storage']['fields']


# ------------------------------------------------------------------------------------------ 10. writer threads
@pytest.mark.slow  # 20 TensorBoard writers created and joined: 2.5-6 s on two busy cores
def test_dropped_buffers_do_not_keep_their_tensorboard_writers(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = threading.active_count()
    for k in range(20):
        buf = create_buffer(
            dict(type='advanced', replay_buffer_size=8, monitor=dict(tensorboard=True), storage=dict(type='tensor')),
            exp_name='leak',
            instance_name=f'b{k}',
        )
        buf.push(item(0))
        del buf
        gc.collect()
    deadline = time.monotonic() + 10
    while threading.active_count() > before + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= before + 2


# ------------------------------------------------------------------------------------------ 11. errors name the input
@pytest.mark.parametrize(
    'leaf', [[[1.0, 2.0], [3.0]], [None, 1.0], ['a', 'b'], [2**70, 1], [torch.zeros(2), torch.zeros(2)]]
)
@pytest.mark.parametrize('storage', ['list', 'tensor'])
def test_batched_python_lists_that_are_no_array_are_refused_naming_the_field(leaf, storage):
    buf = create_buffer(dict(type='naive', replay_buffer_size=8, seed=0, storage=dict(type=storage)))
    if storage == 'list':
        buf.push({'field_x': [1.0, 2.0]}, batched=True)
        return  # list storage keeps Python objects: rows are split, not converted
    before = buf.state_dict()
    with pytest.raises((TypeError, ValueError), match='field_x'):
        buf.push({'field_x': leaf}, batched=True)
    assert_same(buf.state_dict(), before)


@pytest.mark.parametrize('storage', ['list', 'tensor'])
def test_an_empty_batch_is_a_clear_error(storage):
    buf = create_buffer(dict(type='naive', replay_buffer_size=8, seed=0, storage=dict(type=storage)))
    with pytest.raises(ValueError, match='size 0'):
        buf.push({'x': torch.zeros(0, 2)}, batched=True)
    assert buf.count() == 0


@pytest.mark.parametrize('device', ['cpu:x', 'cuda:', 'gpu', 'cpu:0:1'])
def test_bad_device_names_the_key(device):
    with pytest.raises(ValueError, match='storage.device'):
        create_buffer(dict(type='naive', storage=dict(type='tensor', device=device)))
    with pytest.raises(ValueError, match='device'):
        create_buffer(dict(type='gfn', device=device))


def test_saved_envelope_without_a_state_dict_is_a_value_error(tmp_path):
    torch.save(
        {'format': 'ding_buffer', 'version': 1, 'buffer': 'NaiveReplayBuffer', 'state': [1, 2]}, str(tmp_path / 'x.pt')
    )
    torch.save({'format': 'ding_buffer', 'version': 1, 'buffer': 'NaiveReplayBuffer'}, str(tmp_path / 'y.pt'))
    buf = create_buffer(dict(type='naive', replay_buffer_size=8))
    for name in ('x.pt', 'y.pt'):
        with pytest.raises(ValueError, match='state'):
            buf.load_data(str(tmp_path / name))


@pytest.mark.parametrize('btype', ['naive', 'advanced'])
def test_negative_counters_in_a_state_are_refused(btype):
    buf = create_buffer(dict(type=btype, replay_buffer_size=8, seed=0, storage=dict(type='tensor')))
    buf.push([item(i) for i in range(3)])
    state = buf.state_dict()
    state['counters'] = dict(state['counters'], sample_calls=-1)
    before = buf.state_dict()
    with pytest.raises(ValueError, match='counters'):
        buf.load_state_dict(state)
    assert_same(buf.state_dict(), before)


# ------------------------------------------------------------------------------------------ 13. GFlowNet settings
def test_gflownet_load_adopts_the_saved_capacity_as_documented(tmp_path):
    small = create_buffer(dict(type='gfn', replay_buffer_size=8, seed=0))
    small.push({'state': torch.randn(6, 3), 'log_reward': torch.zeros(6)})
    small.save_data(str(tmp_path / 'g.pt'))
    big = create_buffer(dict(type='gfn', replay_buffer_size=100, seed=0))
    big.load_data(str(tmp_path / 'g.pt'))
    assert big.capacity == 8 and big.count() == 6


def test_sample_timeout_still_raises_after_the_checks():
    buf = create_buffer(dict(type='naive', replay_buffer_size=8))
    with pytest.raises(SampleTimeoutError):
        buf.sample(2, timeout=0.1)


def test_a_relative_memmap_dir_keeps_its_files_after_a_chdir(tmp_path, monkeypatch):
    """A relative memmap_dir was joined with the working directory at the first push, and close() after a chdir
    looked elsewhere: the files, which can be larger than memory, were left behind."""
    (tmp_path / 'run').mkdir()
    (tmp_path / 'elsewhere').mkdir()
    monkeypatch.chdir(tmp_path / 'run')
    buf = create_buffer(dict(type='naive', replay_buffer_size=8, storage=dict(type='tensor', memmap_dir='mm')))
    monkeypatch.chdir(tmp_path / 'elsewhere')
    buf.push({'obs': torch.zeros(3)})
    assert len(os.listdir(tmp_path / 'run' / 'mm')) == 1 and not (tmp_path / 'elsewhere' / 'mm').exists()
    buf.close()
    assert os.listdir(tmp_path / 'run' / 'mm') == []


def test_memmap_dir_that_is_a_file_is_refused_at_construction(tmp_path):
    (tmp_path / 'f').write_text('x')
    with pytest.raises(ValueError, match='storage.memmap_dir'):
        create_buffer(dict(type='naive', storage=dict(type='tensor', memmap_dir=str(tmp_path / 'f'))))


def test_prioritized_windows_with_zero_priorities_reload_their_own_state():
    """With eps=0 an update may set step priorities to 0 (allowed); the buffer's own state must still load."""
    cfg = dict(
        type='prioritized_episode',
        replay_buffer_size=4,
        max_transitions=40,
        seed=0,
        sampler=dict(unroll_len=3, eps=0.0),
    )
    buf = create_buffer(cfg)
    buf.push([{'obs': torch.zeros(5, 2)}, {'obs': torch.ones(4, 2)}])
    out = buf.sample(2)
    buf.update(
        {
            'replay_unique_id': out['replay_unique_id'],
            'replay_buffer_idx': out['replay_buffer_idx'],
            'priority': torch.zeros(2, 3),
        }
    )
    other = create_buffer(cfg)
    other.load_state_dict(buf.state_dict())
    assert_same(other.state_dict(), buf.state_dict())
    state = buf.state_dict()
    state['windows']['step'] = state['windows']['step'].clone()
    state['windows']['step'][-1] = 1.0  # a priority on a slot no episode owns: refused
    with pytest.raises(ValueError):
        other.load_state_dict(state)


@pytest.mark.parametrize('preset', ['naive', 'advanced', 'episode'])
@pytest.mark.parametrize('batched', [False, True])
def test_a_meta_tensor_is_refused_before_anything_is_stored(preset, batched):
    """A meta tensor has a shape and no data: refused by name, and the refused push stores nothing (it used to
    count its items before failing on the copy)."""
    cfg = dict(type=preset, replay_buffer_size=10, storage=dict(type='tensor'))
    if preset == 'episode':
        cfg['max_transitions'] = 100
    buf = create_buffer(cfg)
    buf.push(
        {'obs': torch.zeros(4, 3)} if preset == 'episode' or batched else {'obs': torch.zeros(3)},
        batched=batched and preset != 'episode',
    )
    before, n = buf.state_dict(), buf.count()
    bad = (
        {'obs': torch.zeros(4, 3, device='meta')}
        if preset == 'episode' or batched
        else {'obs': torch.zeros(3, device='meta')}
    )
    with pytest.raises(TypeError, match="field 'obs' is a meta tensor"):
        buf.push(bad, batched=batched and preset != 'episode')
    assert buf.count() == n
    assert_same(buf.state_dict(), before)


MIXTURE = dict(type='mixture', seed=0, members=dict(a=dict(type='naive', seed=1), b=dict(type='naive', seed=2)))


@pytest.mark.parametrize('cfg', [dict(type='naive', seed=0), dict(type='gfn', seed=0), MIXTURE])
@pytest.mark.parametrize('flag', ['False', 'no', 0, 1, [0], None])
def test_only_a_real_bool_allows_pickle(tmp_path, cfg, flag):
    """allow_pickle='False' (what a config file or a command-line flag gives) used to unpickle: only True does."""
    src = create_buffer(copy.deepcopy(cfg))
    data = {'obs': object()} if cfg['type'] != 'gfn' else {'state': torch.zeros(1, 2), 'log_reward': torch.zeros(1)}
    src.push(data)
    path = str(tmp_path / 'buf.pt')
    src.save_data(path)
    buf = create_buffer(copy.deepcopy(cfg))
    before = buf.state_dict()
    with pytest.raises(TypeError, match=r"allow_pickle must be a bool"):
        buf.load_data(path, allow_pickle=flag)
    assert_same(buf.state_dict(), before)


@pytest.mark.parametrize('cfg', [dict(type='naive', seed=0), dict(type='advanced', seed=0), MIXTURE])
def test_a_closed_buffer_takes_no_state(cfg):
    """load_state_dict / load_data of a closed buffer succeeded, and re-created the memmap files close() removed."""
    src = create_buffer(copy.deepcopy(cfg))
    src.push({'obs': 1})
    buf = create_buffer(copy.deepcopy(cfg))
    buf.close()
    with pytest.raises(RuntimeError, match='closed'):
        buf.load_state_dict(src.state_dict())
    assert buf.count() == 0


_NO_THREADS = r'''
import threading, torch
from ding_buffer import create_buffer
torch.manual_seed(0)
b = create_buffer(dict(type='advanced', replay_buffer_size=64, seed=0))
start = threading.Thread.start
def refuse(self):
    raise RuntimeError("can't start new thread")
threading.Thread.start = refuse  # (as at interpreter exit on Python 3.12.0-3.12.1, or at a thread limit)
b.extend({'obs': torch.randn(32, 4)})
out = b.sample(4)
threading.Thread.start = start
print(b.count(), out is not None, b.stats()['priority_mass'])
'''


def test_a_push_that_cannot_start_the_kernel_loader_runs_on_the_fallback():
    """The first kernel use starts a thread that loads the compiled kernels; where none can start, the push raised
    after its items were stored (with no priority: never drawn). It goes on without the compiled kernels."""
    from helpers import subprocess_env

    env = subprocess_env()
    env.pop('DING_BUFFER_NO_NUMBA', None)
    proc = subprocess.run([sys.executable, '-c', _NO_THREADS], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ['32', 'True', '32.0']


def test_a_writer_closed_where_no_thread_can_start_is_closed_in_the_caller(tmp_path, monkeypatch):
    """TensorBoard's flush / close wait in a helper thread; at interpreter exit on Python 3.12.0-3.12.1 none may
    start, and close() raised with the writer never flushed. It is closed in the calling thread then."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / 'tb'))
    buf = create_buffer(
        dict(type='advanced', replay_buffer_size=64, seed=0, monitor=dict(sampled_data_attr=dict(print_freq=1))),
        tb_logger=writer,
    )
    buf.extend({'obs': torch.randn(32, 4)})
    buf.sample(8, cur_learner_iter=0)
    start = threading.Thread.start

    def refuse(self):
        if self.name == 'tb_writer_wait':
            raise RuntimeError("can't create new thread at interpreter shutdown")
        return start(self)

    monkeypatch.setattr(threading.Thread, 'start', refuse)
    buf.close()  # (raised RuntimeError before)
    acc = EventAccumulator(str(tmp_path / 'tb'), size_guidance={'scalars': 0})
    acc.Reload()
    assert any('priority' in tag for tag in acc.Tags()['scalars'])
    writer.close()


def _refusing(monkeypatch, prefix):
    """``threading.Thread.start`` raising for threads named ``prefix...`` (as at interpreter exit on Python
    3.12.0-3.12.1, or at a thread limit)."""
    start = threading.Thread.start

    def refuse(self):
        if self.name.startswith(prefix) or self.name.endswith(prefix):
            raise RuntimeError("can't create new thread at interpreter shutdown")
        return start(self)

    monkeypatch.setattr(threading.Thread, 'start', refuse)


def test_a_periodic_monitor_that_cannot_start_its_thread_does_not_fail_the_push(monkeypatch, tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / 'tb'))
    buf = create_buffer(
        dict(type='naive', replay_buffer_size=8, periodic_thruput_seconds=0.2, seed=0), tb_logger=writer
    )
    _refusing(monkeypatch, '_thruput')
    assert buf.push({'obs': 1}) == 1 and buf.push({'obs': 2}) == 1  # (the first push raised before)
    assert len(buf.sample(2)) == 2
    buf.close()  # (raised: cannot join thread before it is started)
    writer.close()


def test_used_data_files_go_in_the_caller_where_the_remover_thread_cannot_start(monkeypatch, tmp_path):
    paths = [tmp_path / f'{i}.bin' for i in range(6)]
    for p in paths:
        p.write_bytes(b'x')
    buf = create_buffer(dict(type='naive', replay_buffer_size=4, enable_track_used_data=True, seed=0))
    buf.push([{'data_id': str(p)} for p in paths[:4]])
    _refusing(monkeypatch, 'delete_used_data')
    assert buf.push([{'data_id': str(p)} for p in paths[4:]]) == 2  # evicts 0 and 1 (raised after storing them)
    assert [p.exists() for p in paths] == [False, False, True, True, True, True]
    buf.close()  # (raised: cannot join thread before it is started; the stored items keep their files)
    assert [p.exists() for p in paths] == [False, False, True, True, True, True]


_LEFT_OPEN = r'''
import sys
from ding_buffer import create_buffer
buf = create_buffer(dict(type='naive', replay_buffer_size=4, enable_track_used_data=True, seed=0))
buf.push([{'data_id': p} for p in sys.argv[1:]])  # 5 items: the first one's file is evicted
'''


def test_a_tracked_buffer_left_open_at_exit_deletes_its_evicted_files(tmp_path):
    from helpers import subprocess_env

    paths = [str(tmp_path / f'{i}.bin') for i in range(5)]
    for p in paths:
        open(p, 'wb').close()
    proc = subprocess.run(
        [sys.executable, '-c', _LEFT_OPEN, *paths], capture_output=True, text=True, timeout=120, env=subprocess_env()
    )
    assert proc.returncode == 0 and 'Traceback' not in proc.stderr and 'did not stop' not in proc.stderr, proc.stderr
    assert [os.path.exists(p) for p in paths] == [False, True, True, True, True]
