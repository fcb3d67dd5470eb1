"""Thread safety of the one-lock buffers, and the used-data remover (enable_track_used_data)."""

import os
import threading

import numpy as np
import pytest
import torch
from helpers import assert_same, run_threads, wait_until

from ding_buffer import create_buffer


@pytest.mark.parametrize('storage', ['list', 'tensor'])
def test_concurrent_push_sample_clear_keep_invariants(storage):
    capacity, n_pushers, seconds = 256, 3, 2.0
    buf = create_buffer(dict(type='naive', replay_buffer_size=capacity, seed=0, storage=dict(type=storage)))
    pushed, sampled_ids, clears = [0] * n_pushers, [], [0]

    def pusher(k):
        def work(stop):
            rng = np.random.default_rng(k)
            seq = 0
            while not stop.is_set():
                n = int(rng.integers(1, 20))
                ids = [k * 10**9 + seq + i for i in range(n)]
                seq += n
                buf.push([{'id': i, 'obs': np.full(3, i % 1000, dtype=np.float32)} for i in ids])
                pushed[k] += n
                assert buf.count() <= capacity

        return work

    def sampler(k):
        def work(stop):
            rng = np.random.default_rng(100 + k)
            while not stop.is_set():
                batch = buf.sample(16, replace=bool(rng.random() < 0.5))
                if batch is None:
                    continue
                ids = batch['id'].tolist() if storage == 'tensor' else [item['id'] for item in batch]
                sampled_ids.extend(ids)

        return work

    def clearer(stop):
        while not stop.wait(0.05):
            buf.clear()
            clears[0] += 1

    run_threads([pusher(k) for k in range(n_pushers)] + [sampler(k) for k in range(2)] + [clearer], seconds)
    assert clears[0] > 0 and sampled_ids
    assert 0 <= buf.count() <= capacity
    # every sampled item was pushed by some pusher
    for i in set(sampled_ids):
        k, seq = divmod(i, 10**9)
        assert 0 <= k < n_pushers and seq < pushed[k]
    # push_count counts what was pushed since the last clear; after a final clear + known pushes it is exact
    buf.clear()
    total = 0
    for n in (5, 300, 7):
        buf.push([{'id': 0, 'obs': np.zeros(3, dtype=np.float32)}] * n)
        total += n
    assert buf.push_count == total and buf.count() == capacity


def test_concurrent_pushers_push_count_is_exact():
    buf = create_buffer(dict(type='naive', replay_buffer_size=1000, storage=dict(type='tensor')))
    per_thread = 2000

    def pusher(stop):
        for i in range(per_thread // 4):
            buf.push([{'x': float(i)}] * 4)

    run_threads([pusher] * 4)
    assert buf.push_count == 4 * per_thread
    assert buf.count() == 1000
    ids = buf.sample(1000)['replay_unique_id']
    assert sorted(ids.tolist()) == list(range(4 * per_thread - 1000, 4 * per_thread))


def _tracked_items(tmp_path, start, n):
    items = []
    for i in range(start, start + n):
        path = tmp_path / f'data_{i}.pt'
        torch.save(torch.full((2,), float(i)), path)
        items.append({'data_id': str(path), 'i': i})
    return items


def test_used_data_files_are_deleted_on_overwrite_and_clear(tmp_path):
    buf = create_buffer(dict(type='naive', replay_buffer_size=4, enable_track_used_data=True))
    buf.start()
    buf.push(_tracked_items(tmp_path, 0, 6))  # items 0 and 1 are overwritten
    assert wait_until(lambda: not (tmp_path / 'data_0.pt').exists() and not (tmp_path / 'data_1.pt').exists())
    assert all((tmp_path / f'data_{i}.pt').exists() for i in range(2, 6))
    buf.clear()
    assert wait_until(lambda: not any(tmp_path.iterdir()))
    buf.close()


def test_a_used_up_batch_keeps_its_files_until_the_next_batch_is_used_up(tmp_path):
    """naive with max_use: a sample removes the items it used up. Their files were deleted at once, while the
    learner was still to read them; they go when the next sample uses items up, or at close() (advanced keeps
    used-up items, with their files, until they are overwritten)."""
    buf = create_buffer(dict(type='naive', replay_buffer_size=8, max_use=1, seed=0, enable_track_used_data=True))
    buf.push(_tracked_items(tmp_path, 0, 8))
    first = buf.sample(3)
    drawn = {d['i'] for d in first}
    buf.clear()  # the other five are handed over after the batch: the one thread deletes in order
    assert wait_until(lambda: not any((tmp_path / f'data_{i}.pt').exists() for i in set(range(8)) - drawn))
    assert all(torch.equal(torch.load(d['data_id']), torch.full((2,), float(d['i']))) for d in first)
    buf.push(_tracked_items(tmp_path, 8, 4))
    second = buf.sample(2)
    assert wait_until(lambda: not any(os.path.exists(d['data_id']) for d in first))
    assert all(os.path.exists(d['data_id']) for d in second) and buf.count() == 2
    buf.close()  # the second batch's files go; the two items still stored keep theirs
    live = {f'data_{i}.pt' for i in range(8, 12)} - {f"data_{d['i']}.pt" for d in second}
    assert {p.name for p in tmp_path.iterdir()} == live


@pytest.mark.parametrize('how', ['pushed again', 'extended again', 'state loaded', 'file loaded'])
def test_a_held_file_whose_item_is_stored_again_is_kept(tmp_path, how):
    """A used-up item's file is held until the next sample that uses items up; an item with that data_id stored
    again meanwhile (pushed again, or in a loaded state) had its file deleted then, or at close()."""
    cfg = dict(type='naive', replay_buffer_size=4, max_use=1, seed=0, enable_track_used_data=True)
    buf = create_buffer(cfg)
    (item,) = _tracked_items(tmp_path, 0, 1)
    buf.push(item)
    state = buf.state_dict()
    buf.save_data(str(tmp_path / 'buf.pt'))
    assert buf.sample(1)[0]['i'] == 0 and buf.count() == 0  # used up: its file is held
    if how == 'pushed again':
        buf.push(dict(item))
    elif how == 'extended again':
        assert buf.extend({key: [value] for key, value in item.items()}) == 1
    elif how == 'state loaded':
        buf.load_state_dict(state)
    else:
        buf.load_data(str(tmp_path / 'buf.pt'))
    assert buf.count() == 1
    buf.close()  # deletes what it holds, but not a stored item's file
    assert torch.equal(torch.load(item['data_id']), torch.zeros(2))


def test_a_batched_push_of_tracked_items_is_checked_as_a_list_push(tmp_path):
    """extend() took data_ids that are not paths (or none at all), which a list push refuses: the push after a
    sample raised after storing them, and a later honest push that overwrote them raised too."""
    buf = create_buffer(dict(type='naive', replay_buffer_size=2, max_use=1, seed=0, enable_track_used_data=True))
    buf.push(_tracked_items(tmp_path, 0, 2))
    buf.sample(1)  # one file held
    before = buf.state_dict()
    for bad, err, match in (
        ({'data_id': np.array([1, 2]), 'obs': np.zeros((2, 3))}, TypeError, "item 0 field 'data_id' must be a path"),
        ({'data_id': torch.arange(2), 'obs': np.zeros((2, 3))}, TypeError, "item 0 field 'data_id' must be a path"),
        ({'obs': np.zeros((2, 3))}, ValueError, "'data_id' field holds a path for each item"),
    ):
        with pytest.raises(err, match=match):
            buf.extend(bad)
        assert_same(buf.state_dict(), before)
    items = _tracked_items(tmp_path, 2, 2)
    assert buf.extend({'data_id': [d['data_id'] for d in items], 'i': [2, 3]}) == 2
    assert buf.push(_tracked_items(tmp_path, 4, 2)) == 2  # overwrites them: their files go
    buf.close()
    assert not (tmp_path / 'data_2.pt').exists() and (tmp_path / 'data_4.pt').exists()


class _NoPath(os.PathLike):
    """A path-like whose ``__fspath__`` gives no path."""

    def __fspath__(self):
        return 7


def test_a_path_like_data_id_that_gives_no_path_is_refused_at_push(tmp_path):
    """The remover read a path-like's path only when the item left: the push that evicted it, the sample that used
    it up and clear() raised after changing the buffer (a retried push stored its item twice)."""
    buf = create_buffer(dict(type='naive', replay_buffer_size=2, max_use=1, seed=0, enable_track_used_data=True))
    buf.push(_tracked_items(tmp_path, 0, 1))
    before = buf.state_dict()
    for call in (lambda: buf.push([{'data_id': _NoPath()}]), lambda: buf.extend({'data_id': [_NoPath()], 'i': [0]})):
        with pytest.raises(TypeError, match=r"item 0 field 'data_id' \(_NoPath\) gives no path"):
            call()
        assert_same(buf.state_dict(), before)
    assert buf.push(_tracked_items(tmp_path, 1, 2)) == 2 and buf.count() == 2
    buf.clear()
    buf.close()


def test_a_batch_larger_than_the_buffer_deletes_the_files_of_the_rows_it_never_stores(tmp_path):
    buf = create_buffer(dict(type='naive', replay_buffer_size=2, enable_track_used_data=True))
    items = _tracked_items(tmp_path, 0, 5)
    assert buf.extend({'data_id': [d['data_id'] for d in items], 'i': list(range(5))}) == 5
    buf.close()
    assert [(tmp_path / f'data_{i}.pt').exists() for i in range(5)] == [False, False, False, True, True]


def test_a_push_that_stores_nothing_does_not_keep_a_held_file(tmp_path):
    """A push the rate limit refuses (stores nothing) took a used-up item's file off the held list: it was never
    deleted, not even at close()."""
    limit = dict(push_sample_rate_limit=dict(max=1.0, min=0))
    cfg = dict(type='naive', replay_buffer_size=8, max_use=1, seed=0, enable_track_used_data=True)
    buf = create_buffer(dict(cfg, thruput_controller=limit))
    buf.push(_tracked_items(tmp_path, 0, 4))
    used = buf.sample(2)
    assert buf.push(dict(used[0])) == 0 and buf.stats()['refused_push'] == 1
    buf.close()
    assert not any(os.path.exists(d['data_id']) for d in used)


def test_used_data_directories_are_removed_without_a_shell(tmp_path):
    buf = create_buffer(dict(type='naive', replay_buffer_size=1, enable_track_used_data=True))
    weird = tmp_path / 'dir with spaces; rm -rf x'
    weird.mkdir()
    (weird / 'payload.bin').write_bytes(b'123')
    sentinel = tmp_path / 'x'
    sentinel.write_text('must survive')
    buf.push({'data_id': str(weird)})
    buf.push({'data_id': str(tmp_path / 'missing_file_is_fine')})  # evicts `weird`
    assert wait_until(lambda: not weird.exists())
    assert sentinel.read_text() == 'must survive'
    buf.close()


def test_close_drains_pending_deletions_and_joins(tmp_path):
    buf = create_buffer(dict(type='naive', replay_buffer_size=2, enable_track_used_data=True))
    buf.push(_tracked_items(tmp_path, 0, 10))
    buf.clear()
    buf.close()
    assert list(tmp_path.iterdir()) == []
    assert not any(t.name == 'delete_used_data' and t.is_alive() for t in threading.enumerate())
    buf.close()  # idempotent


def test_tracking_rejects_items_without_data_id_and_stores_nothing(tmp_path):
    buf = create_buffer(dict(type='naive', replay_buffer_size=4, enable_track_used_data=True))
    good = _tracked_items(tmp_path, 0, 1)[0]
    with pytest.raises(ValueError, match="'data_id'"):
        buf.push([good, {'no_id': 1}])
    with pytest.raises(TypeError, match="'data_id' must be a path"):
        buf.push({'data_id': 5})
    assert buf.count() == 0 and os.path.exists(good['data_id'])
    buf.close()


def test_a_tracked_state_whose_item_names_no_file_is_refused_at_load(tmp_path):
    """A push refuses an item whose data_id is not a path; a state holding one loaded, and the push that later
    evicted it failed after writing (a bare TypeError, with the new item stored)."""
    paths = []
    for name in 'abc':
        paths.append(str(tmp_path / name))
        open(paths[-1], 'w').close()
    cfg = dict(type='naive', replay_buffer_size=2, enable_track_used_data=True)
    src = create_buffer(cfg)
    src.push([{'data_id': paths[0]}, {'data_id': paths[1]}])
    state = src.state_dict()
    src.close()
    for bad in ({'data_id': 5}, 'not a dict'):
        state['storage']['items'][0] = bad
        buf = create_buffer(cfg)
        before = buf.state_dict()
        with pytest.raises(ValueError, match='item 0'):
            buf.load_state_dict(state)
        assert_same(buf.state_dict(), before)
        assert buf.push({'data_id': paths[2]}) == 1
        buf.close()


def test_a_start_racing_close_starts_no_thread_once_close_began(tmp_path):
    # start() waits for the lock; close() flips the buffer closed under it: the start that comes second refuses,
    # and no remover or monitor thread outlives close()
    buf = create_buffer(
        dict(type='naive', replay_buffer_size=4, enable_track_used_data=True, periodic_thruput_seconds=0.05),
        tb_logger=None,
    )
    outcome = []

    def starter():
        try:
            buf.start()
            outcome.append('started')
        except RuntimeError as e:
            outcome.append(str(e))

    with buf.lock:  # (as another call of the buffer's own would hold it)
        t = threading.Thread(target=starter)
        t.start()
        t.join(0.3)
        assert t.is_alive()  # waiting for the lock
        buf.close()
    t.join(10)
    assert len(outcome) == 1 and 'closed' in outcome[0]
    assert not [th for th in threading.enumerate() if th.name in ('delete_used_data', 'buffer_thruput')]
