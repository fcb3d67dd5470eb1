"""Monitors of the advanced buffer: ``SampledDataAttrMonitor``, ``PeriodicThruputMonitor``, TensorBoard wiring.

Covers DI-engine's tag names and steps (anchors/dingengine-buffers.md section 7), a real ``SummaryWriter``
read back with TensorBoard's ``EventAccumulator``, ownership of the writer (borrowed vs. created), ``stats()``
and the threads a buffer starts and must stop on ``close()``.
Every wait is bounded by a deadline; nothing here sleeps for long.
"""

import copy
import glob
import logging
import math
import os
import threading
import time

import numpy as np
import pytest
import torch
from helpers import assert_same

from ding_buffer import create_buffer
from ding_buffer.monitor.periodic import PeriodicThruputMonitor
from ding_buffer.monitor.sampled_data import KEYS, SampledDataAttrMonitor
from ding_buffer.monitor.tb import emit

WINDOW_KEYS = (
    'use_avg',
    'use_max',
    'priority_avg',
    'priority_max',
    'priority_min',
    'staleness_avg',
    'staleness_max',
    'beta',
)
# stats() reports the window's statistics but the buffer's *current* beta (checked separately)
STATS_KEYS = tuple(k for k in WINDOW_KEYS if k != 'beta')
SEC_TAGS = ('pushed_in', 'sampled_out', 'removed', 'current_have')
LOGGER = logging.getLogger('ding_buffer.test_monitor')


# ------------------------------------------------------------------------------------------ helpers
class FakeTB:
    """Records ``add_scalar(tag, value, step)``; thread-safe enough for the periodic thread (list.append)."""

    def __init__(self):
        self.calls = []
        self.flushed = 0
        self.closed = False

    def add_scalar(self, tag, value, step):
        self.calls.append((tag, value, step))

    def flush(self):
        self.flushed += 1

    def close(self):
        self.closed = True

    def of(self, tag):
        return [(step, value) for t, value, step in list(self.calls) if t == tag]

    def tags(self):
        return {t for t, _, _ in list(self.calls)}


class RaisingTB(FakeTB):
    def add_scalar(self, tag, value, step):
        super().add_scalar(tag, value, step)
        raise RuntimeError('writer broke')


def wait_until(pred, timeout=10.0, interval=0.01):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return pred()


def new_threads(before):
    return [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]


# An outer bound on waits that must end (a hang fails the test); never a speed requirement: a loaded machine passes.
GENEROUS = 30.0


def assert_no_new_threads(before, timeout=GENEROUS):
    ok = wait_until(lambda: not new_threads(before), timeout)
    assert ok, f"threads still alive: {[t.name for t in new_threads(before)]}"


def row(use, priority, staleness, beta):
    use, priority, staleness = (np.asarray(x, dtype=np.float64) for x in (use, priority, staleness))
    return {
        'use_avg': use.mean(),
        'use_max': use.max(),
        'priority_avg': priority.mean(),
        'priority_max': priority.max(),
        'priority_min': priority.min(),
        'staleness_avg': staleness.mean(),
        'staleness_max': staleness.max(),
        'beta': beta,
    }


def window_of(rows):
    """Reference aggregation of DI-engine's monitor: mean of *_avg, max of *_max, min of *_min, last beta."""
    out = {}
    for k in WINDOW_KEYS:
        vals = [r[k] for r in rows]
        if k.endswith('_max'):
            out[k] = max(vals)
        elif k.endswith('_min'):
            out[k] = min(vals)
        elif k == 'beta':
            out[k] = vals[-1]
        else:
            out[k] = sum(vals) / len(vals)
    return out


def read_scalars(logdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={'scalars': 0}, purge_orphaned_data=False)
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()['scalars']}


def event_files(logdir):
    return glob.glob(os.path.join(str(logdir), '**', 'events.out.tfevents.*'), recursive=True)


def tensor_cfg(**kw):
    cfg = dict(type='advanced', replay_buffer_size=64, seed=0, storage=dict(type='tensor'))
    cfg.update(kw)
    return cfg


def items(n, start=0, collect_iter=None):
    return [
        {
            'obs': torch.tensor([float(start + i)]),
            'collect_iter': (start + i) % 3 if collect_iter is None else collect_iter,
            'priority': 1.0 + (start + i) % 7,
        }
        for i in range(n)
    ]


def row_of_batch(batch, beta):
    return row(batch['use'].numpy(), batch['priority'].numpy(), batch['staleness'].numpy(), beta)


# ------------------------------------------------------------------------------------------ 1. SampledDataAttrMonitor
# Four hand-made batches: (use, priority, staleness, beta) and their per-batch rows, computed by hand.
B0 = ([1, 2], [1.0, 3.0], [0, 4], 0.4)  # use 1.5/2, prio 2/3/1, stale 2/4
B1 = ([1, 1, 4], [0.5, 0.5, 2.0], [1, 1, 1], 0.5)  # use 2/4, prio 1/2/0.5, stale 1/1
B2 = ([3], [6.0], [-1], 0.6)  # use 3/3, prio 6/6/6, stale -1/-1
B3 = ([2, 2], [0.25, 0.75], [10, 0], 0.7)  # use 2/2, prio 0.5/0.75/0.25, stale 5/10


def _arrays(batch):
    use, prio, stale, beta = batch
    return np.array(use, dtype=np.int64), np.array(prio, dtype=np.float64), np.array(stale, dtype=np.int64), beta


def test_keys_constant_matches_dingengine():
    assert tuple(KEYS) == WINDOW_KEYS


def test_sampled_monitor_empty_window_has_no_averages():
    mon = SampledDataAttrMonitor('m', average_range=3, print_freq=2, logger=LOGGER, tb_logger=FakeTB())
    assert mon.averages() == {}


def test_sampled_monitor_window_and_write_schedule(caplog):
    tb = FakeTB()
    mon = SampledDataAttrMonitor('mon', average_range=3, print_freq=2, logger=LOGGER, tb_logger=tb)
    # hand-computed expected window after each call (average_range=3)
    expected = [
        # call 0: [B0]
        dict(
            use_avg=1.5,
            use_max=2,
            priority_avg=2.0,
            priority_max=3.0,
            priority_min=1.0,
            staleness_avg=2.0,
            staleness_max=4,
            beta=0.4,
        ),
        # call 1: [B0, B1]
        dict(
            use_avg=1.75,
            use_max=4,
            priority_avg=1.5,
            priority_max=3.0,
            priority_min=0.5,
            staleness_avg=1.5,
            staleness_max=4,
            beta=0.5,
        ),
        # call 2: [B0, B1, B2]
        dict(
            use_avg=6.5 / 3,
            use_max=4,
            priority_avg=3.0,
            priority_max=6.0,
            priority_min=0.5,
            staleness_avg=2 / 3,
            staleness_max=4,
            beta=0.6,
        ),
        # call 3: [B1, B2, B3]  (B0 fell out of the window)
        dict(
            use_avg=7 / 3,
            use_max=4,
            priority_avg=2.5,
            priority_max=6.0,
            priority_min=0.25,
            staleness_avg=5 / 3,
            staleness_max=10,
            beta=0.7,
        ),
        # call 4: [B2, B3, B0]
        dict(
            use_avg=6.5 / 3,
            use_max=3,
            priority_avg=8.5 / 3,
            priority_max=6.0,
            priority_min=0.25,
            staleness_avg=2.0,
            staleness_max=10,
            beta=0.4,
        ),
    ]
    calls = [(B0, 10, 100), (B1, 11, 200), (B2, -1, 300), (B3, 13, 400), (B0, 40, -1)]
    with caplog.at_level(logging.INFO, logger=LOGGER.name):
        for i, (batch, it, env) in enumerate(calls):
            n_before = len(tb.calls)
            emit(mon.record(*_arrays(batch), cur_learner_iter=it, cur_collector_envstep=env), LOGGER, tb)
            avg = mon.averages()
            assert set(avg) == set(WINDOW_KEYS)
            for k in WINDOW_KEYS:
                assert avg[k] == pytest.approx(expected[i][k], abs=1e-12), (i, k)
            # cross-check the hand values with the reference aggregation
            lo = max(0, i - 2)
            ref = window_of([row(*b) for b, _, _ in calls[lo : i + 1]])
            for k in WINDOW_KEYS:
                assert ref[k] == pytest.approx(expected[i][k], abs=1e-12)
            written = tb.calls[n_before:]
            if i % 2:  # print_freq=2: only calls 0, 2, 4 write
                assert written == []
                continue
            want = []
            for k in WINDOW_KEYS:
                if it != -1:
                    want.append((f'mon_iter/{k}', it))
                if env != -1:
                    want.append((f'mon_step/{k}', env))
            assert sorted((t, s) for t, _, s in written) == sorted(want)
            for tag, value, step in written:
                k = tag.split('/', 1)[1]
                assert value == pytest.approx(expected[i][k], abs=1e-12)
                assert isinstance(value, float)
    # iter tags: calls 0 (iter 10) and 4 (iter 40); call 2 had iter -1
    for k in WINDOW_KEYS:
        assert [s for s, _ in tb.of(f'mon_iter/{k}')] == [10, 40]
        assert [s for s, _ in tb.of(f'mon_step/{k}')] == [100, 300]  # call 4 had envstep -1
    assert tb.of('mon_iter/priority_min') == [(10, 1.0), (40, 0.25)]
    assert tb.of('mon_step/use_avg') == [(100, 1.5), (300, pytest.approx(6.5 / 3))]
    msgs = [r.getMessage() for r in caplog.records if r.name == LOGGER.name]
    heads = [m.splitlines()[0] for m in msgs if m.startswith('=== Sample data')]
    assert heads == ['=== Sample data 0 Times ===', '=== Sample data 2 Times ===', '=== Sample data 4 Times ===']
    assert all(k in msgs[0] for k in WINDOW_KEYS)


def test_sampled_monitor_print_freq_one_and_average_range_one():
    tb = FakeTB()
    mon = SampledDataAttrMonitor('x', average_range=1, print_freq=1, logger=LOGGER, tb_logger=tb)
    for i, b in enumerate([B0, B1, B2, B3]):
        emit(mon.record(*_arrays(b), cur_learner_iter=i, cur_collector_envstep=-1), mon.logger, mon.tb_logger)
        assert mon.averages() == pytest.approx(row(*b))
    assert [s for s, _ in tb.of('x_iter/beta')] == [0, 1, 2, 3]
    assert [v for _, v in tb.of('x_iter/beta')] == pytest.approx([0.4, 0.5, 0.6, 0.7])
    assert not any(t.startswith('x_step/') for t in tb.tags())


def test_sampled_monitor_without_writer_still_logs(caplog):
    mon = SampledDataAttrMonitor('nolog', average_range=2, print_freq=3, logger=LOGGER, tb_logger=None)
    with caplog.at_level(logging.INFO, logger=LOGGER.name):
        for b in [B0, B1, B2, B3]:
            emit(mon.record(*_arrays(b), cur_learner_iter=5, cur_collector_envstep=5), mon.logger, mon.tb_logger)
    heads = [r.getMessage().splitlines()[0] for r in caplog.records if r.getMessage().startswith('=== Sample')]
    assert heads == ['=== Sample data 0 Times ===', '=== Sample data 3 Times ===']
    assert mon.averages() == pytest.approx(window_of([row(*B2), row(*B3)]))


# ------------------------------------------------------------------------------------------ 2. PeriodicThruputMonitor
class Counters:
    def __init__(self, **kw):
        self.lock = threading.Lock()
        self.values = dict(push_items=0, sampled_items=0, remove_count=0, count=0, sample_calls=0)
        self.values.update(kw)
        self.reads = 0

    def read(self):
        with self.lock:
            self.reads += 1
            return dict(self.values)

    def set(self, **kw):
        with self.lock:
            self.values.update(kw)


def test_periodic_report_differences_and_tags():
    tb, c = FakeTB(), Counters()
    mon = PeriodicThruputMonitor('pm', 60, c.read, LOGGER, tb)
    c.set(push_items=10, sampled_items=4, remove_count=1, count=9)
    assert mon.report() == {'pushed_in': 10, 'sampled_out': 4, 'removed': 1, 'current_have': 9}
    c.set(push_items=15, sampled_items=12, remove_count=1, count=14)
    assert mon.report() == {'pushed_in': 5, 'sampled_out': 8, 'removed': 0, 'current_have': 14}
    assert mon.report() == {'pushed_in': 0, 'sampled_out': 0, 'removed': 0, 'current_have': 14}
    c.set(push_items=100, sampled_items=20, remove_count=50, count=64)
    assert mon.report() == {'pushed_in': 85, 'sampled_out': 8, 'removed': 49, 'current_have': 64}
    assert tb.tags() == {f'pm_sec/{t}' for t in SEC_TAGS}
    assert tb.of('pm_sec/pushed_in') == [(0, 10), (1, 5), (2, 0), (3, 85)]
    assert tb.of('pm_sec/sampled_out') == [(0, 4), (1, 8), (2, 0), (3, 8)]
    assert tb.of('pm_sec/removed') == [(0, 1), (1, 0), (2, 0), (3, 49)]
    assert tb.of('pm_sec/current_have') == [(0, 9), (1, 14), (2, 14), (3, 64)]
    assert mon._thread is None  # report() alone starts nothing


def test_periodic_report_logs_line(caplog):
    c = Counters(push_items=3, count=3)
    mon = PeriodicThruputMonitor('logme', 2.5, c.read, LOGGER, None)  # no writer: log only
    with caplog.at_level(logging.INFO, logger=LOGGER.name):
        assert mon.report()['pushed_in'] == 3
    msg = [r.getMessage() for r in caplog.records if 'buffer statistics' in r.getMessage()]
    assert len(msg) == 1 and 'In the past 2.5 seconds' in msg[0] and 'pushed_in=3' in msg[0]


def test_periodic_thread_reports_and_close_joins_promptly():
    before = {t.ident for t in threading.enumerate()}
    tb, c = FakeTB(), Counters(push_items=5, count=5)
    mon = PeriodicThruputMonitor('thr', 0.1, c.read, LOGGER, tb)
    mon.start()
    try:
        thread = mon._thread
        assert thread is not None and thread.is_alive() and thread.daemon
        c.set(push_items=12, sampled_items=4, remove_count=1, count=11)  # baseline at start() was push 5
        assert wait_until(lambda: sum(v for _, v in tb.of('thr_sec/pushed_in')) == 7, timeout=10)
        assert wait_until(lambda: len(tb.of('thr_sec/current_have')) >= 2, timeout=10)
    finally:
        mon.close(timeout=GENEROUS)
    assert not thread.is_alive()  # close joined it (a period of 0.1 s: woken at once, not a speed requirement)
    for tag in SEC_TAGS:
        steps = [s for s, _ in tb.of(f'thr_sec/{tag}')]
        assert steps == list(range(len(steps)))
    assert sum(v for _, v in tb.of('thr_sec/sampled_out')) == 4
    assert sum(v for _, v in tb.of('thr_sec/removed')) == 1
    assert tb.of('thr_sec/current_have')[-1][1] == 11
    n = len(tb.calls)
    time.sleep(0.3)
    assert len(tb.calls) == n  # no report after close
    assert_no_new_threads(before)


def test_periodic_close_wakes_a_long_period_thread():
    c = Counters()
    mon = PeriodicThruputMonitor('slow', 3600, c.read, LOGGER, FakeTB())
    mon.start()
    thread = mon._thread
    mon.close(timeout=GENEROUS)
    assert not thread.is_alive()  # woken within the join's bound, not after its hour-long period


def test_periodic_start_twice_is_one_thread_and_close_before_start():
    before = {t.ident for t in threading.enumerate()}
    c = Counters()
    mon = PeriodicThruputMonitor('twice', 0.1, c.read, LOGGER, FakeTB())
    mon.start()
    first = mon._thread
    mon.start()
    try:
        assert mon._thread is first
        mine = [t for t in new_threads(before) if t.name == 'twice_thruput']
        assert len(mine) == 1
        assert c.reads >= 1
    finally:
        mon.close(timeout=GENEROUS)
    assert not first.is_alive()
    mon.close()  # idempotent

    # close() before start(): fine, and a later start() starts nothing
    tb2 = FakeTB()
    mon2 = PeriodicThruputMonitor('never', 0.05, Counters().read, LOGGER, tb2)
    mon2.close()
    mon2.start()
    assert mon2._thread is None
    time.sleep(0.15)
    assert tb2.calls == []
    assert_no_new_threads(before)


def test_periodic_thread_survives_a_failing_writer(caplog):
    tb, c = RaisingTB(), Counters(push_items=1, count=1)
    mon = PeriodicThruputMonitor('boom', 0.05, c.read, LOGGER, tb)
    with caplog.at_level(logging.ERROR, logger=LOGGER.name):
        mon.start()
        try:
            assert wait_until(lambda: len(tb.calls) >= 2, timeout=10)  # kept running after the first failure
            assert mon._thread.is_alive()
        finally:
            mon.close(timeout=GENEROUS)
    assert not mon._thread.is_alive()
    assert any('periodic thruput monitor failed' in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------------------------------------ 3. end to end, real writer
def test_end_to_end_real_summary_writer(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    logdir = tmp_path / 'tb'
    writer = SummaryWriter(str(logdir))
    before = {t.ident for t in threading.enumerate()}
    buf = create_buffer(
        tensor_cfg(
            anneal_step=10,
            # seconds=0.2 is refused by the config (see test_fractional_numeric_config_is_accepted): use 1
            monitor=dict(sampled_data_attr=dict(average_range=2, print_freq=1), periodic_thruput=dict(seconds=1)),
        ),
        tb_logger=writer,
        instance_name='demo',
    )
    try:
        buf.start()
        rows, writes = [], []  # writes: (learner iter, envstep, expected window)
        assert buf.push(items(40), cur_collector_envstep=100) == 40
        b = buf.sample(8, cur_learner_iter=5)
        beta = buf.beta  # (annealed by this draw: DI-engine's monitor writes it after its anneal)
        rows.append(row_of_batch(b, beta))
        writes.append((5, 100, window_of(rows[-2:])))
        assert buf.push(items(30, start=40), cur_collector_envstep=250) == 30  # 6 overwritten (capacity 64)
        b = buf.sample(8, cur_learner_iter=7)
        beta = buf.beta
        rows.append(row_of_batch(b, beta))
        writes.append((7, 250, window_of(rows[-2:])))
        assert buf.push(items(2, start=70), cur_collector_envstep=300) == 2
        b = buf.sample(4, cur_learner_iter=-1)  # iter tag skipped, step tag written at envstep 300
        beta = buf.beta
        rows.append(row_of_batch(b, beta))
        writes.append((-1, 300, window_of(rows[-2:])))
        stats = buf.stats()
        for k in STATS_KEYS:
            assert stats[k] == pytest.approx(writes[-1][2][k], rel=1e-9, abs=1e-12)
        assert stats['push_items'] == 72 and stats['sampled_items'] == 20 and stats['remove_count'] == 8
        assert stats['count'] == 64
        # wait two more periods so that one report began after the last push/sample
        p0 = buf._periodic.period
        assert wait_until(lambda: buf._periodic.period >= p0 + 2, timeout=10)
        assert any(t.name == 'demo_thruput' for t in new_threads(before))
    finally:
        buf.close()
    assert_no_new_threads(before)
    # borrowed writer: still usable after buffer.close()
    writer.add_scalar('after/close', 1.5, 3)
    writer.flush()
    writer.close()

    scalars = read_scalars(logdir)
    expected_tags = {f'demo_iter/{k}' for k in WINDOW_KEYS} | {f'demo_step/{k}' for k in WINDOW_KEYS}
    expected_tags |= {f'demo_sec/{t}' for t in SEC_TAGS} | {'after/close'}
    assert set(scalars) == expected_tags
    assert scalars['after/close'] == [(3, 1.5)]
    for k in WINDOW_KEYS:
        it_writes = [(it, w[k]) for it, _, w in writes if it != -1]
        got = scalars[f'demo_iter/{k}']
        assert [s for s, _ in got] == [s for s, _ in it_writes] == [5, 7]
        assert [v for _, v in got] == pytest.approx([v for _, v in it_writes], rel=1e-6, abs=1e-6)
        got = scalars[f'demo_step/{k}']
        assert [s for s, _ in got] == [100, 250, 300]
        assert [v for _, v in got] == pytest.approx([w[k] for _, _, w in writes], rel=1e-6, abs=1e-6)
        # (beta: stats() and the tag both give the beta this draw annealed to, as DI-engine's monitor writes it)
        assert got[-1][1] == pytest.approx(stats[k], rel=1e-6, abs=1e-6)
    # spot checks against the raw data: beta annealed 0.4 -> 0.46 -> 0.52 -> 0.58 by the three sample calls
    assert [v for _, v in scalars['demo_step/beta']] == pytest.approx([0.46, 0.52, 0.58])
    assert scalars['demo_iter/use_max'][0][1] >= 1.0
    sec = {t: scalars[f'demo_sec/{t}'] for t in SEC_TAGS}
    n = len(sec['pushed_in'])
    assert n >= 2
    for t in SEC_TAGS:
        assert [s for s, _ in sec[t]] == list(range(n))
    assert sum(v for _, v in sec['pushed_in']) == 72
    assert sum(v for _, v in sec['sampled_out']) == 20
    assert sum(v for _, v in sec['removed']) == 8
    assert sec['current_have'][-1][1] == 64


def test_periodic_counts_the_first_push_without_explicit_start():
    tb = FakeTB()
    cfg = tensor_cfg(monitor=dict(periodic_thruput=dict(seconds=3600)))
    buf = create_buffer(cfg, tb_logger=tb, instance_name='lazy')
    try:
        buf.push(items(5), cur_collector_envstep=1)
        buf.push(items(2, start=5), cur_collector_envstep=2)
        values = buf._periodic.report()
        assert values['current_have'] == 7
        assert values['pushed_in'] == 7
    finally:
        buf.close()


def test_periodic_reports_a_buffer_that_is_only_sampled():
    """Offline RL: a buffer filled by load_state_dict and then only sampled writes its _sec scalars too -- the
    partial period at close() at least, with every sampled item counted and nothing pushed."""
    src = create_buffer(tensor_cfg())
    src.push(items(40))
    tb = FakeTB()
    buf = create_buffer(tensor_cfg(monitor=dict(periodic_thruput=dict(seconds=3600))), tb_logger=tb)
    buf.load_state_dict(src.state_dict())
    for _ in range(5):
        assert buf.sample(8) is not None
    buf.close()
    assert sum(v for _, v in tb.of('buffer_sec/sampled_out')) == 40
    assert sum(v for _, v in tb.of('buffer_sec/pushed_in')) == 0
    assert tb.of('buffer_sec/current_have')[-1][1] == 40


@pytest.mark.parametrize(
    'extra',
    [
        dict(monitor=dict(periodic_thruput=dict(seconds=0.2))),
        dict(thruput_controller=dict(window_seconds=2.5)),
        dict(thruput_controller=dict(sample_min_limit_ratio=1.5)),
        dict(thruput_controller=dict(push_sample_rate_limit=dict(max=4, min=0.5))),
    ],
    ids=['periodic_thruput.seconds', 'window_seconds', 'sample_min_limit_ratio', 'push_sample_rate_limit.min'],
)
def test_fractional_numeric_config_is_accepted(extra):
    buf = create_buffer(tensor_cfg(**extra), tb_logger=FakeTB(), instance_name='frac')
    buf.close()


def test_owned_writer_created_under_dingengine_path_and_closed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = {t.ident for t in threading.enumerate()}
    buf = create_buffer(
        tensor_cfg(
            monitor=dict(
                tensorboard=True,
                sampled_data_attr=dict(average_range=2, print_freq=1),
                periodic_thruput=dict(seconds=1),  # int: see the float-config bug
            )
        ),
        exp_name='myexp',
        instance_name='own',
    )
    try:
        buf.start()
        buf.push(items(16), cur_collector_envstep=50)
        b = buf.sample(4, cur_learner_iter=3)
        assert b is not None
        stats = buf.stats()
        assert wait_until(lambda: buf._periodic.period >= 1, timeout=10)
    finally:
        buf.close()
    buf.close()  # idempotent
    assert_no_new_threads(before)  # the writer's own flushing thread is gone too: it was closed
    logdir = tmp_path / 'myexp' / 'log' / 'own' / 'own_tb_logger'
    assert logdir.is_dir()
    assert event_files(logdir)
    assert sorted(os.listdir(tmp_path)) == ['myexp']
    scalars = read_scalars(logdir)
    assert scalars['own_iter/use_avg'] == [(3, pytest.approx(stats['use_avg']))]
    assert scalars['own_step/priority_max'] == [(50, pytest.approx(stats['priority_max']))]
    assert scalars['own_sec/current_have'][0] == (0, 16)


def test_owned_writer_default_exp_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    buf = create_buffer(tensor_cfg(monitor=dict(tensorboard=True)), instance_name='dflt')
    try:
        buf.push(items(4), cur_collector_envstep=7)
        buf.sample(2, cur_learner_iter=1)
    finally:
        buf.close()
    logdir = tmp_path / 'default_experiment' / 'log' / 'dflt' / 'dflt_tb_logger'
    assert event_files(logdir)
    assert 'dflt_iter/beta' in read_scalars(logdir)


def test_owned_writer_takes_an_absolute_exp_name_and_names_another_value_as_dingengine_does(tmp_path, monkeypatch):
    """An absolute exp_name is where the files go (the docs say so; DI-engine's buffers write below the working
    directory); exp_name=None raised a bare os.path TypeError, and is './None/...' as DI-engine formats it."""
    work, outside = tmp_path / 'work', tmp_path / 'outside'
    work.mkdir()
    monkeypatch.chdir(work)
    for exp_name, where in ((str(outside / 'exp'), outside / 'exp'), (None, work / 'None')):
        buf = create_buffer(tensor_cfg(monitor=dict(tensorboard=True)), exp_name=exp_name, instance_name='abs')
        try:
            buf.push(items(4), cur_collector_envstep=7)
            buf.sample(2, cur_learner_iter=1)
        finally:
            buf.close()
        assert event_files(where / 'log' / 'abs' / 'abs_tb_logger')
    assert sorted(os.listdir(work)) == ['None']


def test_tensorboard_flag_with_borrowed_writer_uses_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tb = FakeTB()
    buf = create_buffer(tensor_cfg(monitor=dict(tensorboard=True)), tb_logger=tb, instance_name='b')
    buf.push(items(4), cur_collector_envstep=7)
    buf.sample(2, cur_learner_iter=1)
    buf.close()
    assert os.listdir(tmp_path) == []
    assert not tb.closed and tb.flushed >= 1
    assert 'b_iter/use_avg' in tb.tags() and 'b_step/use_avg' in tb.tags()


def test_no_writer_creates_no_files_and_no_thread(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    before = {t.ident for t in threading.enumerate()}
    buf = create_buffer(tensor_cfg(monitor=dict(sampled_data_attr=dict(print_freq=1))), instance_name='quiet')
    with caplog.at_level(logging.INFO, logger='ding_buffer.quiet'):
        buf.start()
        buf.push(items(8), cur_collector_envstep=3)
        assert buf.sample(4, cur_learner_iter=2) is not None
        assert new_threads(before) == []
    assert any(r.getMessage().startswith('=== Sample data 0 Times ===') for r in caplog.records)
    assert set(WINDOW_KEYS) <= set(buf.stats())
    buf.close()
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------------------------------ 4. stats() and close()
def test_stats_flat_numbers_and_window_keys():
    buf = create_buffer(
        tensor_cfg(
            anneal_step=10,
            thruput_controller=dict(push_sample_rate_limit=dict(max=1, min=0)),
            monitor=dict(sampled_data_attr=dict(average_range=3, print_freq=100)),
        ),
        tb_logger=FakeTB(),
        instance_name='st',
    )
    try:
        assert buf.sample(2) is None  # empty: refused
        s = buf.stats()
        for k in (
            'count',
            'push_items',
            'sample_calls',
            'sampled_items',
            'remove_count',
            'refused_push',
            'refused_push_items',
            'refused_sample',
            'beta',
            'max_priority',
        ):
            assert k in s, k
        assert not (set(WINDOW_KEYS) - {'beta'}) & set(s)  # no window before the first sample
        assert s['refused_sample'] == 1 and s['count'] == 0 and s['beta'] == pytest.approx(0.4)

        assert buf.push(items(10), cur_collector_envstep=4) == 10
        beta0 = buf.beta
        b = buf.sample(10, cur_learner_iter=6)
        assert buf.push(items(3, start=10)) == 0  # (10 + 3) / 10 > max 1: refused
        s = buf.stats()
        for k, v in s.items():
            assert isinstance(k, str)
            assert type(v) in (int, float), (k, type(v))
            assert math.isfinite(v), k
        assert s['count'] == 10 and s['push_items'] == 10 and s['sample_calls'] == 1 and s['sampled_items'] == 10
        assert s['remove_count'] == 0 and s['refused_sample'] == 1
        assert s['refused_push'] == 1 and s['refused_push_items'] == 3
        assert buf.beta == pytest.approx(0.46)  # annealed once: the next call's beta
        assert s['max_priority'] == 1.0  # DI-engine: pushed priorities do not raise it, only update() does
        buf.update(
            {
                'replay_unique_id': b['replay_unique_id'],
                'replay_buffer_idx': b['replay_buffer_idx'],
                'priority': torch.full((10,), 9.0),
            }
        )
        assert buf.stats()['max_priority'] == pytest.approx(9.0)
        expected = row_of_batch(b, beta0)
        assert set(WINDOW_KEYS) <= set(s)
        for k in STATS_KEYS:
            assert s[k] == pytest.approx(expected[k]), k
        assert expected['beta'] == pytest.approx(0.4)  # the window's beta is the one the batch used
        assert s['staleness_max'] == int(b['staleness'].max()) <= 6  # cur_learner_iter 6 - collect_iter >= 0
    finally:
        buf.close()


def test_stats_beta_is_the_buffers_current_beta():
    buf = create_buffer(tensor_cfg(anneal_step=10), tb_logger=FakeTB(), instance_name='beta')
    try:
        buf.push(items(8))
        assert buf.stats()['beta'] == pytest.approx(0.4) == buf.beta  # before any sample: the current beta
        buf.sample(4)
        buf.beta = 0.9
        assert buf.stats()['beta'] == pytest.approx(0.9)  # actual: 0.4, the window's beta
    finally:
        buf.close()


def test_window_is_not_changed_by_later_updates_and_samples():
    buf = create_buffer(
        tensor_cfg(monitor=dict(sampled_data_attr=dict(average_range=2, print_freq=1))),
        tb_logger=FakeTB(),
        instance_name='snap',
    )
    try:
        buf.push(items(16), cur_collector_envstep=1)
        beta = buf.beta
        b1 = buf.sample(16, cur_learner_iter=2)
        r1 = row_of_batch(b1, beta)
        first = {k: buf.stats()[k] for k in STATS_KEYS}
        assert first == pytest.approx({k: r1[k] for k in STATS_KEYS})
        # new priorities for the sampled items: the recorded batch must not follow them
        res = buf.update(
            {
                'replay_unique_id': b1['replay_unique_id'],
                'replay_buffer_idx': b1['replay_buffer_idx'],
                'priority': torch.full((16,), 100.0),
            }
        )
        assert res['updated'] == 16
        assert {k: buf.stats()[k] for k in STATS_KEYS} == first
        # a second sample bumps the use counts of the same slots; the first row keeps its own counts
        beta = buf.beta
        b2 = buf.sample(16, cur_learner_iter=3)
        r2 = row_of_batch(b2, beta)
        assert r2['use_max'] >= 2 and r2['priority_max'] == pytest.approx(100.0, rel=1e-4)
        s = buf.stats()
        for k in STATS_KEYS:
            assert s[k] == pytest.approx(window_of([r1, r2])[k]), k
    finally:
        buf.close()


def test_close_idempotent_and_stops_every_thread(tmp_path):
    before = {t.ident for t in threading.enumerate()}
    paths = []
    for i in range(6):
        p = tmp_path / f'd{i}.bin'
        p.write_bytes(b'x')
        paths.append(str(p))
    buf = create_buffer(
        dict(
            type='advanced',
            replay_buffer_size=4,
            seed=0,
            enable_track_used_data=True,
            storage=dict(type='list'),
            monitor=dict(periodic_thruput=dict(seconds=1)),
        ),
        tb_logger=FakeTB(),
        instance_name='thr',
    )
    buf.start()
    buf.start()
    buf.push([{'data_id': p, 'x': i} for i, p in enumerate(paths)], cur_collector_envstep=1)  # 2 overwritten
    assert buf.sample(2, cur_learner_iter=1) is not None
    names = sorted(t.name for t in new_threads(before))
    assert names == ['delete_used_data', 'thr_thruput']
    buf.close()
    assert_no_new_threads(before)
    buf.close()  # idempotent
    assert_no_new_threads(before)
    assert not os.path.exists(paths[0]) and not os.path.exists(paths[1])
    with pytest.raises(RuntimeError):
        buf.push({'data_id': paths[2]})
    with pytest.raises(RuntimeError):
        buf.sample(1)
    with pytest.raises(RuntimeError):
        buf.start()
    assert buf.stats()['push_items'] == 6  # still readable after close


def test_close_without_start_or_push_starts_and_leaves_nothing():
    before = {t.ident for t in threading.enumerate()}
    tb = FakeTB()
    buf = create_buffer(tensor_cfg(), tb_logger=tb, instance_name='idle')
    assert new_threads(before) == []
    buf.close()
    buf.close()
    assert new_threads(before) == []
    assert not tb.closed


def test_context_manager_closes_threads():
    before = {t.ident for t in threading.enumerate()}
    with create_buffer(
        tensor_cfg(monitor=dict(periodic_thruput=dict(seconds=1))), tb_logger=FakeTB(), instance_name='ctx'
    ) as buf:
        buf.push(items(4))
        assert [t.name for t in new_threads(before)] == ['ctx_thruput']
    assert_no_new_threads(before)


# -------------------------------------------------------------------------------- TensorBoard outside the lock
class BlockingTB:
    """A writer whose add_scalar blocks until released: shows whether the buffer holds its lock meanwhile
    (``left``: a call has returned)."""

    def __init__(self):
        self.entered, self.release, self.left, self.tags = threading.Event(), threading.Event(), threading.Event(), []

    def add_scalar(self, tag, value, step):
        self.tags.append(tag)
        self.entered.set()
        self.release.wait(2 * GENEROUS)
        self.left.set()

    def flush(self):
        pass


@pytest.mark.parametrize('kind', ['advanced', 'gfn'])
def test_tensorboard_is_written_outside_the_buffer_lock(kind):
    import torch

    from ding_buffer import create_buffer

    tb = BlockingTB()
    if kind == 'advanced':
        buf = create_buffer(dict(type='advanced', replay_buffer_size=8, storage=dict(type='tensor')), tb_logger=tb)
        buf.push({'obs': torch.ones(2)})
        act = lambda: buf.sample(1, cur_learner_iter=1)  # noqa: E731  (the first sample is logged)
    else:
        buf = create_buffer(dict(type='gfn', replay_buffer_size=8, monitor=dict(log_every=1)), tb_logger=tb)
        act = lambda: buf.push({'state': torch.ones(2, 3), 'log_reward': torch.zeros(2)})  # noqa: E731
    t = threading.Thread(target=act)
    t.start()
    assert tb.entered.wait(GENEROUS), 'nothing was written'
    n = buf.count()  # needs the buffer's lock: it must not wait for the blocked writer
    blocked = not tb.left.is_set()  # was: count() within 0.5 s, which a loaded machine missed
    tb.release.set()
    t.join(GENEROUS)
    assert not t.is_alive()
    assert blocked and n >= 1, 'count() waited for the writer: the buffer held its lock while writing'
    assert tb.tags and all('_iter/' in tag for tag in tb.tags), tb.tags  # DI-engine's tag names
    buf.close()


@pytest.mark.parametrize('preset', ['advanced', 'naive'])
def test_a_run_shorter_than_one_period_still_writes_its_sec_scalars_on_close(tmp_path, preset):
    """close() writes the last partial period (and flushes the writer), so a short run is not left without
    `{instance}_sec/*`; a buffer that saw nothing since the last report writes nothing more."""
    from torch.utils.tensorboard import SummaryWriter

    logdir = tmp_path / 'tb'
    writer = SummaryWriter(str(logdir))
    cfg = dict(type=preset, replay_buffer_size=64, seed=0, storage=dict(type='tensor'))
    if preset == 'advanced':
        cfg['monitor'] = dict(periodic_thruput=dict(seconds=3600))
    else:
        cfg['periodic_thruput_seconds'] = 3600
    buf = create_buffer(cfg, tb_logger=writer, instance_name='short')
    buf.push(items(70))  # 6 overwritten by the ring: removed
    buf.sample(10)
    buf.close()
    buf.close()  # idempotent: no second report
    scalars = read_scalars(logdir)  # before writer.close(): the buffer's close flushed it
    got = {t: v for t, v in scalars.items() if t.startswith('short_sec/')}
    assert got['short_sec/pushed_in'] == [(0, 70)]
    assert got['short_sec/sampled_out'] == [(0, 10)]
    assert got['short_sec/current_have'] == [(0, 64)]
    assert len(got['short_sec/removed']) == 1
    writer.close()


@pytest.mark.timeout(60)
def test_the_periodic_report_counts_what_the_buffer_did_across_a_load():
    """A load of an earlier checkpoint replaces the cumulative counters; the ``_sec`` scalars still add up to what
    was pushed and sampled (never negative), however the periods fall."""
    w = FakeTB()
    buf = create_buffer(dict(type='naive', replay_buffer_size=1000, seed=0, periodic_thruput_seconds=0.05), tb_logger=w)
    buf.push([{'obs': i} for i in range(5)])
    early = buf.state_dict()  # push_items 5
    buf.push([{'obs': i} for i in range(500)])
    buf.sample(100)
    time.sleep(0.2)  # (a period or more reported, or not: the sums below hold either way)
    buf.load_state_dict(early)
    time.sleep(0.2)
    buf.push([{'obs': i} for i in range(3)])
    buf.close()  # writes the last, partial period
    pushed = [v for t, v, _ in w.calls if t == 'buffer_sec/pushed_in']
    sampled = [v for t, v, _ in w.calls if t == 'buffer_sec/sampled_out']
    assert min(pushed + sampled) >= 0
    assert sum(pushed) == 508 and sum(sampled) == 100


@pytest.mark.timeout(60)
@pytest.mark.parametrize('route', ['state_dict', 'save_data'])
def test_the_periodic_report_steps_go_on_in_a_buffer_loaded_from_a_state(route, tmp_path):
    """A resumed run's ``_sec`` curves continue: the loaded buffer's first period is the saved buffer's next one
    (it restarted at 0: a second point at every step the run had already logged)."""
    cfg = dict(type='advanced', replay_buffer_size=100, seed=0, monitor=dict(periodic_thruput=dict(seconds=0.05)))
    first, second = FakeTB(), FakeTB()
    a = create_buffer(cfg, tb_logger=first)
    a.push([{'obs': i} for i in range(5)])
    end = time.monotonic() + 30
    while not any(t == 'buffer_sec/pushed_in' and s >= 2 for t, _, s in first.calls) and time.monotonic() < end:
        time.sleep(0.02)
    with a.lock:  # (no report between the state and the steps read)
        if route == 'state_dict':
            state = a.state_dict()
        else:
            a.save_data(str(tmp_path / 'a.pt'))
        logged = max(s for t, _, s in first.calls if t == 'buffer_sec/pushed_in')
    a.close()
    b = create_buffer(cfg, tb_logger=second)
    if route == 'state_dict':
        b.load_state_dict(state)
    else:
        b.load_data(str(tmp_path / 'a.pt'))
    b.push({'obs': 9})
    b.close()
    steps = [s for t, _, s in second.calls if t == 'buffer_sec/pushed_in']
    # (the period under way when the state was taken is a's, written at its close)
    assert steps and steps[0] == logged + 2 and steps == sorted(set(steps)), (logged, steps)
    assert not set(steps) & {s for t, _, s in first.calls if t == 'buffer_sec/pushed_in'}


def test_a_buffer_with_a_running_monitor_reloads_its_own_state_unchanged_and_a_refused_load_changes_nothing():
    cfg = dict(type='naive', replay_buffer_size=10, seed=0, periodic_thruput_seconds=3600)
    buf = create_buffer(cfg, tb_logger=FakeTB())
    buf.push([{'obs': 1}])  # (the monitor runs)
    state = buf.state_dict()
    for _ in range(3):
        buf.load_state_dict(buf.state_dict())
    assert_same(buf.state_dict(), state)
    mix = create_buffer(
        dict(type='mixture', weights=dict(a=0.5, b=0.5), members=dict(a=dict(cfg), b=dict(cfg)), seed=0),
        tb_logger=FakeTB(),
    )
    before = mix.state_dict()
    bad = copy.deepcopy(before)
    bad['members']['a']['thruput']['periods'] = 1000  # good for member a; member b's state is refused
    bad['members']['b']['counters']['push_items'] = -5
    with pytest.raises(ValueError):
        mix.load_state_dict(bad)
    assert_same(mix.state_dict(), before)
    buf.close()
    mix.close()


@pytest.mark.timeout(60)
def test_close_while_holding_the_lock_ends_the_periodic_thread_and_writes_the_last_period():
    """``with buffer.lock: buffer.close()``: the report thread, waiting for the lock, ends (it does not hold close()
    up until its join gives up), and close() writes the last, partial period itself."""
    w = FakeTB()
    buf = create_buffer(dict(type='naive', replay_buffer_size=100, seed=0, periodic_thruput_seconds=0.05), tb_logger=w)
    buf.push([{'obs': i} for i in range(7)])
    time.sleep(0.2)  # (reports while nothing changes: zeros)
    buf.push([{'obs': i} for i in range(3)])
    with buf.lock:
        time.sleep(0.2)  # the report thread is waiting for the lock now
        buf.close()
    assert not [t for t in threading.enumerate() if t.name == 'buffer_thruput']
    assert sum(v for t, v, _ in w.calls if t == 'buffer_sec/pushed_in') == 10


@pytest.mark.parametrize('fresh', [4, 0])
def test_periodic_counts_the_removals_of_the_sample_that_starts_it(fresh):
    """A loaded buffer's first call is a sample whose staleness rule removes 6 items (then draws, or, with nothing
    fresh left, refuses): its removals are in the report written at close()."""
    cfg = dict(type='naive', replay_buffer_size=100, max_staleness=2, periodic_thruput_seconds=3600, seed=0)
    src = create_buffer(cfg)
    src.push([{'obs': i, 'collect_iter': 0 if i < 6 else 5} for i in range(6 + fresh)])
    tb = FakeTB()
    buf = create_buffer(cfg, tb_logger=tb)
    buf.load_state_dict(src.state_dict())
    out = buf.sample(2, cur_learner_iter=5)
    assert (out is not None) == bool(fresh) and buf.count() == fresh
    buf.close()
    assert sum(v for _, v in tb.of('buffer_sec/removed')) == 6


ENVSTEP_CFG = dict(
    type='advanced',
    replay_buffer_size=16,
    seed=0,
    monitor=dict(sampled_data_attr=dict(average_range=1, print_freq=1), periodic_thruput=dict(seconds=1000)),
)


@pytest.mark.parametrize('route', ['state_dict', 'save_data'])
def test_step_scalars_of_a_reloaded_buffer_continue_on_the_saved_env_step(tmp_path, route):
    """The ``_step`` scalars' x-axis is the env step of the last push taken: a reloaded buffer writes them at the
    saved one, as the buffer it was saved from would (they were skipped until the next push)."""
    straight_tb, resumed_tb = FakeTB(), FakeTB()
    straight = create_buffer(dict(ENVSTEP_CFG), tb_logger=straight_tb, instance_name='buf')
    saved = create_buffer(dict(ENVSTEP_CFG), instance_name='buf')
    for b in (straight, saved):
        b.push([{'obs': torch.ones(2) * i} for i in range(8)], cur_collector_envstep=40)
    resumed = create_buffer(dict(ENVSTEP_CFG), tb_logger=resumed_tb, instance_name='buf')
    if route == 'state_dict':
        resumed.load_state_dict(saved.state_dict())
    else:
        saved.save_data(str(tmp_path / 'buf.pt'))
        resumed.load_data(str(tmp_path / 'buf.pt'))
    straight.sample(4, cur_learner_iter=5)
    resumed.sample(4, cur_learner_iter=5)
    step_rows = lambda tb: sorted((t, s) for t, _, s in tb.calls if t.startswith('buf_step/'))  # noqa: E731
    assert step_rows(straight_tb) and {s for _, s in step_rows(straight_tb)} == {40}
    assert step_rows(resumed_tb) == step_rows(straight_tb)


def test_a_refused_push_does_not_move_the_step_scalars_x_axis():
    cfg = dict(ENVSTEP_CFG, thruput_controller=dict(push_sample_rate_limit=dict(max=2, min=0), window_seconds=30))
    tb = FakeTB()
    buf = create_buffer(cfg, tb_logger=tb, instance_name='buf')
    assert buf.push([{'obs': i} for i in range(8)], cur_collector_envstep=40) == 8
    assert buf.sample(4, cur_learner_iter=1) is not None
    assert buf.push([{'obs': i} for i in range(8)], cur_collector_envstep=999) == 0  # refused by the limiter
    assert buf.stats()['refused_push'] == 1
    assert buf.sample(4, cur_learner_iter=2) is not None
    assert [step for step, _ in tb.of('buf_step/beta')] == [40, 40]


@pytest.mark.parametrize('priority', [False, True])
def test_deque_close_flushes_the_writer_it_wrote_to(priority):
    tb = FakeTB()
    buf = create_buffer(dict(type='deque', replay_buffer_size=8, priority=priority), tb_logger=tb, instance_name='dq')
    buf.push([{'obs': i, 'priority': 1.0} for i in range(4)], 0)
    assert buf.sample(2, 5) is not None and tb.calls
    flushed = tb.flushed
    buf.close()
    assert tb.flushed > flushed and not tb.closed  # (a borrowed writer stays open)


class _CallingBack:
    """A user's writer whose ``add_scalar`` calls the buffer once (an early-stop hook closing it, or a sample)."""

    def __init__(self, call):
        self.call, self.buffer, self.done = call, None, threading.Event()

    def add_scalar(self, tag, value, step):
        if self.buffer is not None:
            buffer, self.buffer = self.buffer, None
            self.call(buffer)
            self.done.set()

    def flush(self):
        pass


@pytest.mark.parametrize('call', ['close', 'sample'])
def test_a_writer_that_calls_back_into_the_buffer_does_not_deadlock(call):
    """The sink held a non-re-entrant lock while it called the writer: a writer closing the buffer (or sampling from
    it) hung the sample for good."""
    writer = _CallingBack(lambda b: b.close() if call == 'close' else b.sample(1, cur_learner_iter=0))
    cfg = dict(type='advanced', replay_buffer_size=8, seed=0, monitor=dict(sampled_data_attr=dict(print_freq=1)))
    buf = create_buffer(cfg, tb_logger=writer)
    buf.push([{'obs': i} for i in range(8)])
    writer.buffer = buf
    worker = threading.Thread(target=buf.sample, args=(2,), kwargs=dict(cur_learner_iter=0), daemon=True)
    worker.start()
    worker.join(20)
    assert not worker.is_alive() and writer.done.is_set()
    if call == 'close':
        with pytest.raises(RuntimeError, match='closed'):
            buf.push({'obs': 9})
    else:
        assert buf.push({'obs': 9}) == 1
    buf.close()


def test_a_periodic_report_whose_writer_closes_the_buffer_ends_its_thread():
    """The monitor's thread, writing a report, closed the buffer: it joined itself (or waited on the sink's lock)
    and stayed blocked after the buffer's close() returned."""
    writer = _CallingBack(lambda b: b.close())
    before = set(threading.enumerate())
    buf = create_buffer(
        dict(type='naive', replay_buffer_size=8, seed=0, periodic_thruput_seconds=0.1), tb_logger=writer
    )
    writer.buffer = buf
    buf.push([{'obs': i} for i in range(8)])
    assert writer.done.wait(20)
    buf.close()
    assert wait_until(lambda: set(threading.enumerate()) <= before, timeout=10)


def test_a_writer_that_reads_its_buffer_from_the_report_thread_does_not_deadlock_a_locked_learner():
    """The sink held its lock while calling the writer: a periodic report's writer reading the buffer (stats) waited
    for the buffer's lock, which a learner held (``with buffer.lock:`` around why_not_sample + sample, as the docs
    advise) while its own scalar waited for the sink's lock: both hung."""
    main = threading.current_thread()
    holder = {}

    class Reading:
        def add_scalar(self, tag, value, step):
            if threading.current_thread() is not main and 'buf' in holder:
                holder['buf'].stats()

        def flush(self):
            pass

    cfg = dict(
        type='advanced',
        replay_buffer_size=64,
        seed=0,
        monitor=dict(sampled_data_attr=dict(average_range=5, print_freq=1), periodic_thruput=dict(seconds=0.01)),
    )
    buf = holder['buf'] = create_buffer(cfg, tb_logger=Reading())
    buf.push([{'obs': i} for i in range(16)])
    steps = [0]

    def learner():
        for i in range(600):
            with buf.lock:
                if buf.why_not_sample(2) == '':
                    buf.sample(2, cur_learner_iter=i)
            steps[0] += 1

    worker = threading.Thread(target=learner, daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive() and steps[0] == 600
    buf.close()
