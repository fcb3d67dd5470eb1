"""Tensor storage with memmap_dir: data lives in files, not in the process's memory."""

import os
import time

import numpy as np
import pytest
import torch
from helpers import assert_same

from ding_buffer import create_buffer


def _rss_bytes():
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


@pytest.mark.skipif(not os.path.exists('/proc/self/statm'), reason='needs Linux /proc')
def test_image_buffer_larger_than_its_resident_memory(tmp_path):
    capacity, shape = 100_000, (4, 84, 84)  # 2.8 GB per image field, 5.6 GB in all
    cfg = dict(
        type='naive', replay_buffer_size=capacity, seed=0, storage=dict(type='tensor', memmap_dir=str(tmp_path / 'mm'))
    )
    buffer = create_buffer(cfg)
    before = _rss_bytes()
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, size=(256, *shape), dtype=np.uint8)
    for k in range(4):
        buffer.extend({'obs': frames, 'next_obs': frames, 'action': np.arange(256) + 256 * k})
    files = sorted(os.listdir(tmp_path / 'mm'))
    assert len(files) == 3
    apparent = sum(os.path.getsize(tmp_path / 'mm' / f) for f in files)
    assert apparent >= 2 * capacity * int(np.prod(shape))  # the full-size fields exist on disk ...
    assert _rss_bytes() - before < 600 * 2**20  # ... but only touched pages are resident
    batch = buffer.sample(64)
    assert batch['obs'].dtype == torch.uint8 and batch['obs'].shape == (64, *shape)
    rows = batch['action'].numpy() % 256
    assert np.array_equal(batch['obs'].numpy(), frames[rows])
    # a save/load round trip works for memmap storage too
    buffer.save_data(str(tmp_path / 'buf.pt'))
    other = create_buffer({**cfg, 'storage': dict(type='tensor', memmap_dir=str(tmp_path / 'mm2'))})
    other.load_data(str(tmp_path / 'buf.pt'))
    assert other.count() == 1024
    slots = batch['replay_buffer_idx'].numpy()
    assert torch.equal(other.storage.gather(slots)['obs'], batch['obs'])


def test_a_dropped_prioritized_episode_buffer_removes_its_files_at_once(tmp_path):
    """Every buffer removes its memmap files when it is dropped; a prioritized episode buffer's store and windows
    referred to each other, so its files stayed until the garbage collector ran."""
    import gc

    for kind in ('episode', 'prioritized_episode'):
        d = tmp_path / kind
        buf = create_buffer(
            dict(type=kind, replay_buffer_size=4, max_transitions=32, storage=dict(type='tensor', memmap_dir=str(d)))
        )
        buf.push({'obs': torch.arange(12.0).reshape(6, 2), 'reward': torch.ones(6)})
        assert os.listdir(d)
        gc.disable()
        try:
            del buf
            assert os.listdir(d) == [], kind
        finally:
            gc.enable()


def test_a_memmap_dir_that_cannot_be_made_is_an_os_error_naming_the_key(tmp_path):
    """Accepted at build (the directory may be possible later), a memmap_dir below a file failed at the first push
    with the bare NotADirectoryError; it names the config key now, and nothing changes."""
    (tmp_path / 'afile').write_text('')
    buf = create_buffer(
        dict(type='naive', replay_buffer_size=4, storage=dict(type='tensor', memmap_dir=str(tmp_path / 'afile' / 'mm')))
    )
    before = buf.state_dict()
    with pytest.raises(NotADirectoryError, match="config key 'storage.memmap_dir' is .*afile/mm'"):
        buf.push({'obs': np.zeros(3)})
    assert_same(buf.state_dict(), before)


_FULL_DISK = '''
import os, resource, signal, tempfile, torch
from ding_buffer import create_buffer
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a file size limit stands in for a full disk
d = tempfile.mkdtemp()
frames = dict(stack=2)
buf = create_buffer(dict(type='advanced', replay_buffer_size=10000, seed=1,
                         storage=dict(type='tensor', memmap_dir=d, frames=frames)))
frame = lambda a, n: torch.full((n, n), a, dtype=torch.uint8)
stack = lambda a, n: torch.stack([frame(a, n), frame(a + 1, n)])
resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.RLIM_INFINITY))  # the frame file fits, a field does not
try:
    buf.push(dict(obs=stack(0, 2), next_obs=stack(1, 2), reward=1.0, done=False))
    raise SystemExit('the push did not fail')
except OSError:
    pass
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
assert os.listdir(d) == [], os.listdir(d)
after = buf.state_dict()['storage']['frames']
assert (after['shape'], after['stack'], len(after['ids'])) == (None, 2, 0), after
assert buf.push(dict(obs=stack(0, 3), next_obs=stack(1, 3), reward=1.0, done=False)) == 1  # any frame shape, as new
print('ok')
'''


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, 'posix_fallocate'), reason='needs posix_fallocate')
def test_a_first_frames_push_that_runs_out_of_disk_leaves_no_frame_ring(tmp_path):
    """The frame ring was made before the other fields; when they did not fit on the disk, the push failed but the
    ring and its file stayed, fixing the frame shape of a buffer that stored nothing."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, '-c', _FULL_DISK], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == 'ok', out.stderr[-2000:]


def test_a_memmap_dir_with_a_nul_byte_is_refused_and_file_errors_name_the_key():
    """A NUL byte can never be in a path: such a memmap_dir was accepted, then every push raised 'embedded null
    byte'. A directory where no file can be made (here /proc/self) named only the file."""
    with pytest.raises(ValueError, match="'storage.memmap_dir' has invalid value"):
        create_buffer(dict(type='naive', replay_buffer_size=4, storage=dict(type='tensor', memmap_dir='mm\x00dir')))
    buf = create_buffer(dict(type='naive', replay_buffer_size=4, storage=dict(type='tensor', memmap_dir='/proc/self')))
    before = buf.state_dict()
    with pytest.raises(OSError, match=r'memmap file /proc/self/.* \(storage.memmap_dir\)'):
        buf.push({'obs': np.zeros(3)})
    assert_same(buf.state_dict(), before)


_CONTAINER = '''
import os, sys, time, torch
from ding_buffer import create_buffer
d, out, value = sys.argv[1], sys.argv[2], float(sys.argv[3])
buf = create_buffer(dict(type='naive', replay_buffer_size=4, seed=0, storage=dict(type='tensor', memmap_dir=d)))
buf.push({'obs': torch.full((3,), value)})
open(out + '.pushed', 'w').close()
deadline = time.monotonic() + 60
while not os.path.exists(out + '.go') and time.monotonic() < deadline:
    time.sleep(0.05)
with open(out, 'w') as f:
    f.write(f"{os.getpid()} {buf.sample(1)['obs'].tolist()}")
buf.close()
'''


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_containers_sharing_a_memmap_dir_keep_their_own_files(tmp_path):
    """Two processes in pid namespaces of their own (containers sharing a volume), both pid 1, on one memmap_dir:
    files named by the pid alone were the same file for both (each read the other's rows)."""
    import subprocess
    import sys

    from helpers import REPO_ROOT, pythonpath

    if subprocess.run(['unshare', '-Urpf', 'true'], capture_output=True).returncode != 0:
        pytest.skip('no pid namespaces here (unshare -Urpf)')
    d, env = tmp_path / 'mm', dict(os.environ, PYTHONPATH=pythonpath())
    d.mkdir()
    procs, outs = [], []
    for value in (1.0, 2.0):  # the second starts once the first stored its row
        out = str(tmp_path / f'out{int(value)}')
        cmd = ['unshare', '-Urpf', sys.executable, '-c', _CONTAINER, str(d), out, str(value)]
        procs.append(subprocess.Popen(cmd, env=env, cwd=str(REPO_ROOT)))
        outs.append(out)
        deadline = time.monotonic() + 60
        while not os.path.exists(out + '.pushed') and procs[-1].poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    for out in outs:
        open(out + '.go', 'w').close()
    for p in procs:
        assert p.wait(timeout=60) == 0
    got = [open(out).read().split(' ', 1) for out in outs]
    assert [pid for pid, _ in got] == ['1', '1']  # (both pid 1, each in its own namespace)
    assert [rows for _, rows in got] == ['[[1.0, 1.0, 1.0]]', '[[2.0, 2.0, 2.0]]']
    assert os.listdir(d) == []  # each removed its own files on close


_KILLED = '''
import os, sys, torch
from ding_buffer import create_buffer
buf = create_buffer(dict(type='naive', replay_buffer_size=4, storage=dict(type='tensor', memmap_dir=sys.argv[1])))
buf.push({'obs': torch.ones(3)})
os._exit(9)  # (dies without closing anything: pid 1 of a namespace ignores its own SIGKILL)
'''


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_restarted_container_removes_the_files_its_killed_predecessor_left(tmp_path):
    """A container restarted after its process was killed runs the new one as pid 1 again: the files the killed pid 1
    left are a dead process's, removed by the new one's first allocation (not kept as another container's, and
    not in the way of its own names)."""
    import subprocess
    import sys

    from helpers import REPO_ROOT, pythonpath

    if subprocess.run(['unshare', '-Urpf', 'true'], capture_output=True).returncode != 0:
        pytest.skip('no pid namespaces here (unshare -Urpf)')
    d, env = tmp_path / 'mm', dict(os.environ, PYTHONPATH=pythonpath())
    d.mkdir()
    cmd = ['unshare', '-Urpf', sys.executable, '-c', _KILLED, str(d)]
    assert subprocess.run(cmd, env=env, cwd=str(REPO_ROOT), timeout=60).returncode != 0  # (killed)
    left = os.listdir(d)
    assert left  # what the killed process left
    restarted = _CONTAINER.replace("open(out + '.pushed', 'w').close()", "open(out + '.go', 'w').close()")
    out = str(tmp_path / 'out')
    cmd = ['unshare', '-Urpf', sys.executable, '-c', restarted, str(d), out, '5.0']
    assert subprocess.run(cmd, env=env, cwd=str(REPO_ROOT), timeout=60).returncode == 0
    assert open(out).read() == '1 [[5.0, 5.0, 5.0]]'
    assert os.listdir(d) == [], (left, os.listdir(d))


def test_a_memmap_dir_holding_a_file_named_with_an_impossible_pid_still_allocates(tmp_path):
    """A file in the directory named like a field file but with a pid no host has (a stray or hostile name) failed
    every allocation with ``OverflowError`` as the orphan sweep asked whether that pid lived; it is left alone."""
    d = tmp_path / 'mm'
    d.mkdir()
    stray = d / ('000_obs.' + '9' * 30 + '-0.bin')
    stray.write_bytes(b'x')
    buf = create_buffer(dict(type='naive', replay_buffer_size=4, storage=dict(type='tensor', memmap_dir=str(d))))
    assert buf.push({'obs': torch.ones(2)}) == 1
    assert stray.read_bytes() == b'x'
    buf.close()
    assert os.listdir(d) == [stray.name]
