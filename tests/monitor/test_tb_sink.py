"""TensorBoard in a pipeline's life: the periodic ``{instance}_sec/*`` report reaches a borrowed writer while the
run goes on, a ``close()`` after the pipeline closed its writer opens no second event file, and a sample racing
``close()`` in another thread never meets a closed writer."""

import glob
import logging
import os
import threading

import pytest
import torch
from helpers import wait_until

from ding_buffer import create_buffer

SummaryWriter = pytest.importorskip('torch.utils.tensorboard').SummaryWriter


def event_files(logdir):
    return sorted(glob.glob(os.path.join(str(logdir), '**', 'events.out.tfevents.*'), recursive=True))


def scalars(logdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={'scalars': 0}, purge_orphaned_data=False)
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()['scalars']}


def items(n):
    return [{'obs': torch.tensor([float(i)]), 'priority': 1.0 + i % 3} for i in range(n)]


@pytest.mark.parametrize(
    'cfg',
    [
        dict(type='naive', periodic_thruput_seconds=0.2),
        dict(type='advanced', monitor=dict(periodic_thruput=dict(seconds=0.2))),
    ],
    ids=['naive', 'advanced'],
)
def test_periodic_report_reaches_a_borrowed_writer_while_the_run_goes_on(tmp_path, cfg):
    writer = SummaryWriter(str(tmp_path / 'tb'))
    buf = create_buffer(dict(cfg, replay_buffer_size=64, seed=0, storage=dict(type='tensor')), tb_logger=writer)
    try:
        buf.push(items(10))

        def written():
            writer.flush()
            return 'buffer_sec/current_have' in scalars(tmp_path / 'tb')

        assert wait_until(written, timeout=10)  # no close() needed
        first = scalars(tmp_path / 'tb')
        assert first['buffer_sec/pushed_in'][0] == (0, 10.0)
        assert first['buffer_sec/current_have'][0] == (0, 10.0)
    finally:
        buf.close()
        writer.close()


def test_close_after_the_pipeline_closed_its_writer_opens_no_second_event_file(tmp_path):
    writer = SummaryWriter(str(tmp_path / 'tb'))
    buf = create_buffer(
        dict(type='naive', replay_buffer_size=64, seed=0, storage=dict(type='tensor')), tb_logger=writer
    )
    buf.push(items(10))
    buf.sample(4, 0)
    writer.close()  # the pipeline ends and closes its writer; the buffer is closed later
    files = event_files(tmp_path / 'tb')
    assert len(files) == 1
    buf.close()  # would write the partial period: dropped, the writer is closed
    assert event_files(tmp_path / 'tb') == files


def test_close_before_the_writer_writes_the_partial_period_into_the_same_file(tmp_path):
    writer = SummaryWriter(str(tmp_path / 'tb'))
    buf = create_buffer(
        dict(type='naive', replay_buffer_size=64, seed=0, storage=dict(type='tensor')), tb_logger=writer
    )
    buf.push(items(7))
    buf.close()
    writer.flush()
    assert scalars(tmp_path / 'tb')['buffer_sec/pushed_in'] == [(0, 7.0)]
    writer.close()
    assert len(event_files(tmp_path / 'tb')) == 1


@pytest.mark.parametrize('owned', [True, False], ids=['owned writer', 'borrowed writer'])
def test_a_sample_racing_close_never_meets_a_closed_writer(tmp_path, monkeypatch, owned):
    """Every sample writes its sampled-data scalars after the buffer's lock is released (print_freq=1): a close()
    in another thread must not close the writer under such a write."""
    monkeypatch.chdir(tmp_path)
    for round_ in range(20):
        writer = None if owned else SummaryWriter(str(tmp_path / f'tb{round_}'))
        buf = create_buffer(
            dict(
                type='advanced',
                replay_buffer_size=64,
                seed=round_,
                storage=dict(type='tensor'),
                monitor=dict(sampled_data_attr=dict(print_freq=1), tensorboard=owned),
            ),
            tb_logger=writer,
            exp_name=f'race{round_}',
        )
        buf.push(items(32))
        errors, started = [], threading.Event()

        def sampler(buf=buf, errors=errors, started=started):
            started.set()
            while True:
                try:
                    buf.sample(8, 1)
                except RuntimeError as e:
                    if 'is closed' in str(e):
                        return
                    errors.append(e)
                    return
                except Exception as e:  # e.g. OSError('Writer is closed')
                    errors.append(e)
                    return

        threads = [threading.Thread(target=sampler) for _ in range(2)]
        for t in threads:
            t.start()
        started.wait(5)
        if owned:  # the owner closes its writer under running samplers
            buf.close()
        else:  # the pipeline closes its writer first, then the buffer
            writer.close()
            buf.close()
        for t in threads:
            t.join(10)
        assert not errors, errors


class HalfClosedWriter:
    """A borrowed writer caught inside its owner's ``close()`` as torch's ``SummaryWriter`` does it: the file
    writers are already shut (a write raises ``OSError('Writer is closed')``) but ``all_writers`` is not yet None."""

    all_writers = {}

    def __init__(self, error):
        self.error = error

    def add_scalar(self, tag, value, step):
        raise self.error

    def flush(self):
        pass


def test_a_borrowed_writer_closing_under_a_write_drops_the_write_and_other_errors_are_logged(caplog):
    def buffer(writer):
        cfg = dict(
            type='advanced',
            replay_buffer_size=64,
            seed=0,
            storage=dict(type='tensor'),
            monitor=dict(sampled_data_attr=dict(print_freq=1)),
        )
        buf = create_buffer(cfg, tb_logger=writer)
        buf.push(items(16))
        return buf

    closing = buffer(HalfClosedWriter(OSError('Writer is closed')))
    assert closing.sample(8, 1)['obs'].shape[0] == 8  # the owner's close overtook the write: dropped
    closing.close()
    failing = buffer(HalfClosedWriter(OSError('No space left on device')))
    with caplog.at_level(logging.WARNING, logger='ding_buffer'):
        batch = failing.sample(8, 1)  # done: the sample is not reported as failed (its batch would be lost)
    assert batch['obs'].shape[0] == 8 and failing.stats()['sample_calls'] == 1
    assert any('No space left' in r.getMessage() for r in caplog.records)
    failing.close()


class BlockingWriter:
    """A borrowed writer whose writes wait until released (a slow disk)."""

    all_writers = {}

    def __init__(self):
        self.entered, self.release, self.tags = threading.Event(), threading.Event(), []

    def add_scalar(self, tag, value, step):
        self.entered.set()
        self.release.wait(20)
        self.tags.append(tag)

    def flush(self):
        pass


@pytest.mark.timeout(60)
@pytest.mark.parametrize('priority', [False, True])
def test_the_deque_writes_tensorboard_after_releasing_the_lock(priority):
    """DI-engine's deque tags are written after the buffer's lock is released, through the same sink as the other
    types: a slow writer holds up only the sample that writes, never another thread's push."""
    writer = BlockingWriter()
    buf = create_buffer(
        dict(type='deque', replay_buffer_size=16, seed=0, priority=priority, train_iter_per_log=1), tb_logger=writer
    )
    buf.push([{'obs': float(i)} for i in range(8)])
    sampler = threading.Thread(target=lambda: buf.sample(4, train_iter=0))
    sampler.start()
    assert writer.entered.wait(20)  # the sample is writing now
    pushed = []
    pusher = threading.Thread(target=lambda: pushed.append(buf.push({'obs': 99.0})))
    pusher.start()
    pusher.join(10)
    done_while_writing = pushed == [1]
    writer.release.set()
    sampler.join(20)
    pusher.join(20)
    assert done_while_writing
    assert 'buffer_iter/buffer_data_count' in writer.tags
    buf.close()


def test_a_failing_writer_never_fails_a_deque_sample_that_is_done(caplog):
    buf = create_buffer(
        dict(type='deque', replay_buffer_size=16, seed=0, max_use=1, train_iter_per_log=1),
        tb_logger=HalfClosedWriter(OSError('No space left on device')),
    )
    buf.push([{'obs': float(i)} for i in range(8)])
    with caplog.at_level(logging.WARNING, logger='ding_buffer'):
        assert len(buf.sample(4, train_iter=0)) == 4  # (max_use=1: its items left; a raise would lose them)
        assert len(buf.sample(4, train_iter=1)) == 4
    assert buf.count() == 0
    assert sum('No space left' in r.getMessage() for r in caplog.records) == 1  # warned once, not per write
    buf.close()
