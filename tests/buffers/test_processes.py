"""Buffers and other processes: a buffer is never copied or pickled (the error says how to move its contents), and
a forked child's copy works there without hanging, drawing the parent's draws, or deleting the parent's files."""

import copy
import os
import pickle
import signal
import threading

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
def test_a_fork_inside_the_forking_threads_own_lock_block_releases_it_there():
    buf = create_buffer(dict(type='naive', replay_buffer_size=4, seed=0))
    with buf.lock:
        out = _in_child(lambda: (buf.push({'obs': torch.zeros(2)}), buf.count())[1])
    assert out == '1' and buf.count() == 0


@pytest.mark.slow
@pytest.mark.parametrize('seed', [None, 3])
def test_forked_children_of_an_unseeded_buffer_draw_their_own_batches(seed):
    buf = create_buffer(dict(type='naive', replay_buffer_size=1000, seed=seed))
    buf.push([{'obs': torch.tensor([float(i)])} for i in range(1000)])

    def draw():
        return sorted(int(x['obs']) for x in buf.sample(16))

    a, b = _in_child(draw), _in_child(draw)
    if seed is None:  # (as DI-engine's buffers in DataLoader workers, which reseed numpy's global RNG)
        assert a != b
    else:  # a given seed draws what it would have drawn
        assert a == b == str(draw())


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
