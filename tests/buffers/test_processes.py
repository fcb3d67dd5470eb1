"""Buffers and other processes: a buffer is never copied or pickled (the error says how to move its contents), and
a forked child's copy works there without hanging, drawing the parent's draws, or deleting the parent's files."""

import copy
import os
import pickle
import signal
import threading

import numpy as np
import pytest
import torch

from ding_buffer import create_buffer

COPIES = {'copy.copy': copy.copy, 'copy.deepcopy': copy.deepcopy, 'pickle': pickle.dumps}


@pytest.mark.parametrize('how', sorted(COPIES))
@pytest.mark.parametrize(
    'cfg',
    [
        dict(type='naive', replay_buffer_size=8),
        dict(type='advanced', replay_buffer_size=8, storage=dict(type='tensor')),
        dict(type='gfn', replay_buffer_size=8),
        dict(type='mixture', members=dict(a=dict(type='naive', replay_buffer_size=4), b=dict(type='naive'))),
    ],
    ids=lambda c: c['type'],
)
def test_a_buffer_is_never_copied_and_the_error_names_the_way(cfg, how):
    buf = create_buffer(cfg)
    if cfg['type'] != 'gfn':
        buf.push([{'obs': torch.ones(2)}] * 3)
    before = buf.count()
    with pytest.raises(TypeError, match=r"cannot be copied or pickled .*state_dict\(\).*load_state_dict"):
        COPIES[how](buf)
    assert buf.count() == before  # (a shallow copy shared the storage: pushes into it landed here)


def _in_child(fn):
    """``fn()`` in a forked child; its returned text (or the error it raised) back, within 20 s."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        signal.alarm(20)  # (a hang fails the test instead of hanging it)
        try:
            out = str(fn())
        except BaseException as e:  # noqa: BLE001
            out = f'raised {type(e).__name__}: {e}'
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        out = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, (status, out)
    return out


@pytest.mark.slow
@pytest.mark.parametrize('cfg', [dict(type='naive'), dict(type='advanced'), dict(type='deque', priority=True)])
def test_a_fork_while_another_thread_holds_the_lock_leaves_the_child_usable(cfg):
    buf = create_buffer(dict(cfg, replay_buffer_size=16, seed=0))
    buf.push([{'obs': torch.full((2,), float(i))} for i in range(8)])
    held, done = threading.Event(), threading.Event()

    def holder():
        with buf.lock:  # e.g. a collector thread inside a push when the learner starts its workers
            held.set()
            done.wait(30)

    t = threading.Thread(target=holder)
    t.start()
    held.wait()
    try:
        out = _in_child(lambda: (buf.push({'obs': torch.zeros(2)}), len(buf.sample(4)), buf.count())[1:])
    finally:
        done.set()
        t.join()
    assert out == '(4, 9)'
    assert buf.count() == 8  # the child's push was its own


@pytest.mark.slow
def test_a_fork_while_another_thread_draws_leaves_the_childs_rng_free():
    """numpy holds a Generator's lock while a draw runs without the GIL: a thread of the parent drawing at the fork
    left it taken in the child, whose first sample waited for good (here a sampler holds it, as numpy does)."""
    from ding_buffer.control.samplers import SAMPLER_REGISTRY

    parent, entered, release = os.getpid(), threading.Event(), threading.Event()

    class Drawing:
        def draw(self, rng, m, size, replace):
            if os.getpid() == parent:
                with rng.bit_generator.lock:
                    entered.set()
                    release.wait(20)
            return rng.choice(m, size=size, replace=replace)

    SAMPLER_REGISTRY.register('test_drawing_sampler', replace=True)(Drawing)
    buf = create_buffer(dict(type='naive', replay_buffer_size=8, seed=0, sampler=dict(type='test_drawing_sampler')))
    buf.push([{'obs': i} for i in range(4)])
    drawing = threading.Thread(target=buf.sample, args=(2,), daemon=True)
    drawing.start()
    assert entered.wait(10)
    try:
        out = _in_child(lambda: len(buf.sample(2)))
    finally:
        release.set()
        drawing.join(10)
    assert out == '2'


@pytest.mark.slow
def test_a_fork_inside_the_forking_threads_own_lock_block_releases_it_there():
    buf = create_buffer(dict(type='naive', replay_buffer_size=4, seed=0))
    with buf.lock:
        out = _in_child(lambda: (buf.push({'obs': torch.zeros(2)}), buf.count())[1])
    assert out == '1' and buf.count() == 0


@pytest.mark.slow
@pytest.mark.parametrize('type_', ['naive', 'mixture'])
@pytest.mark.parametrize('seed', [None, 3])
def test_forked_children_of_an_unseeded_buffer_draw_by_numpys_global_seed(type_, seed):
    # as DI-engine's buffers, which draw from numpy's global RNG: a DataLoader seeds it in each worker, so workers
    # draw different batches, and the same seeds reproduce them; a buffer given a seed draws what it would have
    if type_ == 'mixture':
        members = dict(a=dict(type='naive', replay_buffer_size=500, seed=1), b=dict(type='naive', seed=2))
        buf = create_buffer(dict(type='mixture', members=members, weights=dict(a=0.5, b=0.5), seed=seed))
        for name in ('a', 'b'):
            buf.members[name].push([{'obs': torch.tensor([float(i)])} for i in range(500)])
    else:
        buf = create_buffer(dict(type='naive', replay_buffer_size=1000, seed=seed))
        buf.push([{'obs': torch.tensor([float(i)])} for i in range(1000)])

    def draw(worker):
        def run():
            np.random.seed(worker)  # (what a DataLoader worker does first)
            if type_ == 'naive':
                return sorted(int(x['obs']) for x in buf.sample(64))
            return sum(x['mixture_member'] == 'a' for x in buf.sample(63))  # (the odd item's member is drawn)

        return run

    a, b, a2 = _in_child(draw(0)), _in_child(draw(1)), _in_child(draw(0))
    assert a == a2  # reproduced
    if seed is None:
        assert a != b
    else:
        assert a == b


@pytest.mark.slow
def test_a_forked_childs_copy_never_deletes_its_parents_files(tmp_path):
    mm, disk = tmp_path / 'mm', tmp_path / 'disk'
    naive = create_buffer(dict(type='naive', replay_buffer_size=4, storage=dict(type='tensor', memmap_dir=str(mm))))
    naive.push({'obs': torch.ones(2)})
    chunk = create_buffer(
        dict(type='chunk', max_chunks=10, fragments_per_chunk=1, seed=1, store=dict(type='disk', path=str(disk)))
    )
    for k in range(4):
        chunk.push(dict(worker='w', fid=k, model_version=0, session_id='s', data={'obs': torch.full((2,), float(k))}))
    files = sorted(os.listdir(mm)), sorted(os.listdir(disk))

    def child():
        chunk.push(dict(worker='w', fid=4, model_version=0, session_id='s', data={'obs': torch.zeros(2)}))
        chunk.clear()
        chunk.close()
        naive.close()
        return len(os.listdir(disk))

    assert _in_child(child) == str(len(files[1]))  # the child's own payload went, its parent's stayed
    assert (sorted(os.listdir(mm)), sorted(os.listdir(disk))) == files
    assert chunk.count() == 4 and len(chunk.sample(2)) == 2  # the parent reads every payload it counts
    naive.close()
    assert os.listdir(mm) == []  # the owner removes its own files


@pytest.mark.slow
def test_a_forked_child_drops_tensorboard_writes_and_never_deletes_its_parents_used_data(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / 'tb'))
    paths = [tmp_path / f'{i}.pt' for i in range(4)]
    for p in paths:
        p.write_bytes(b'x')
    cfg = dict(type='advanced', replay_buffer_size=8, seed=0, enable_track_used_data=True)
    buf = create_buffer(dict(cfg, monitor=dict(sampled_data_attr=dict(print_freq=1))), tb_logger=writer)
    buf.push([{'obs': torch.ones(2), 'data_id': str(p)} for p in paths])
    buf.sample(2)  # (a write through the writer: its thread is busy in the parent)

    def child():
        buf.push({'obs': torch.zeros(2), 'data_id': str(tmp_path / 'mine.pt')})
        buf.sample(2)
        buf.clear()
        buf.close()  # (a flush of the parent's writer waited for its thread for good)
        return 'closed'

    assert _in_child(child) == 'closed'
    assert all(p.exists() for p in paths) and buf.count() == 4
    buf.close()
    writer.close()


@pytest.mark.slow
def test_a_grandchild_never_deletes_the_payloads_its_parent_put(tmp_path):
    chunk = create_buffer(
        dict(type='chunk', max_chunks=10, fragments_per_chunk=1, seed=1, store=dict(type='disk', path=str(tmp_path)))
    )

    def put(fid):
        chunk.push(dict(worker='w', fid=fid, model_version=0, session_id='s', data={'obs': torch.full((2,), 1.0)}))

    put(0)

    def child():
        put(1)
        _in_child(lambda: (chunk.clear(), chunk.close()))
        return f'{chunk.count()} {len(chunk.sample(2))} {len(os.listdir(tmp_path))}'

    assert _in_child(child) == '2 2 2'
    assert chunk.count() == 1 and len(chunk.sample(1)) == 1


@pytest.mark.slow
def test_in_a_forked_child_a_refused_sample_changes_nothing_and_a_loaded_state_is_followed():
    buf = create_buffer(dict(type='naive', replay_buffer_size=100))  # (no seed: the child takes a new one)
    buf.push([{'obs': torch.tensor([float(i)])} for i in range(50)])
    state = buf.state_dict()
    twin = create_buffer(dict(type='naive', replay_buffer_size=100))
    twin.load_state_dict(state)
    want = sorted(int(x['obs']) for x in twin.sample(8))

    def child():
        before = buf.state_dict()['rng']
        assert buf.sample(60) is None and buf.state_dict()['rng'] == before  # (refused: more than stored)
        buf.load_state_dict(state)
        return sorted(int(x['obs']) for x in buf.sample(8))

    assert _in_child(child) == str(want)


@pytest.mark.slow
def test_a_buffer_built_in_a_forked_child_with_the_parents_writer_closes(tmp_path, monkeypatch):
    from torch.utils.tensorboard import SummaryWriter

    import ding_buffer.monitor.tb as tb

    monkeypatch.setattr(tb, 'WRITER_WAIT_S', 1.0)  # (the wait for a writer that never returns)
    writer = SummaryWriter(str(tmp_path))

    def child():
        buf = create_buffer(dict(type='naive', replay_buffer_size=8, periodic_thruput_seconds=3600), tb_logger=writer)
        buf.push({'obs': torch.ones(2)})
        buf.close()  # (torch's flush waits for the parent's writing thread: given up on)
        return 'closed'

    assert _in_child(child) == 'closed'
    writer.close()
