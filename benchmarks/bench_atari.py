"""Atari-scale image replay: frames stored once (``storage.frames``) against cpprb and a plain numpy gather.

What is measured (each peer fed its own native inputs, all in one process, rounds alternating the peers)
    Transitions of 84 x 84 uint8 frames in stacks of 4 (``obs`` and ``next_obs`` as gymnasium's
    ``FrameStackObservation`` gives them), episodes of ``--episode`` steps. Frames: real Pong frames when
    ``ale-py`` and gymnasium are installed (``--frames pong``; collected once with ``AtariPreprocessing``, then
    cycled), else deterministic random frames.

    * push one step: ``buffer.push(step_dict)`` (``naive``, ``advanced``) against cpprb's ``ReplayBuffer.add``
      (with ``next_of='obs'``, ``stack_compress='obs'``, ``on_episode_end`` at episode ends, fed ``[84, 84, 4]``
      stacks: its compression stacks along the last axis; fed ``[4, 84, 84]`` it returns wrong stacks) and
      ``PrioritizedReplayBuffer.add``;
    * sample 256 (``obs`` and ``next_obs`` stacks rebuilt): ``naive`` uniform with replacement, ``advanced``
      prioritized; against cpprb's ``sample(256)`` and against a numpy gather of the same number of rows from
      preallocated, pre-stacked ``obs`` / ``next_obs`` arrays (``arr[idx]``: the cost of moving the batch);
    * n-step: ``advanced`` sample 256 with ``n_step=3`` against ``n_step=1``.

    ``--rss N`` (separate processes): resident memory after filling a buffer of N transitions, ours and
    cpprb's, and bytes a transition. Each peer runs in a process of its own that loads the frames from a file (no
    emulator or OpenCV in it): what is measured is the interpreter, the peer's imports and its buffer.

Run
    python benchmarks/bench_atari.py [--capacity 50000] [--rounds 3] [--frames pong|random]
    python benchmarks/bench_atari.py --rss 1000000
Nothing is asserted; results differ across CPUs.
"""

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

STACK, SIDE = 4, 84


def random_frames(n: int = 1024, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, SIDE, SIDE), dtype=np.uint8)


def pong_frames(n: int = 2048, seed: int = 0) -> np.ndarray:
    """``n`` preprocessed Pong frames (84 x 84 grey, frame skip 4) from a random policy."""
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    env = gym.wrappers.AtariPreprocessing(gym.make('PongNoFrameskip-v4'), frame_skip=4, screen_size=SIDE)
    obs, _ = env.reset(seed=seed)
    out = [obs]
    rng = np.random.default_rng(seed)
    while len(out) < n:
        obs, _, term, trunc, _ = env.step(int(rng.integers(env.action_space.n)))
        out.append(obs)
        if term or trunc:
            obs, _ = env.reset()
            out.append(obs)
    env.close()
    return np.stack(out[:n])


def episodes(frames: np.ndarray, episode: int, k: int = 4):
    """``k`` episodes of ``episode`` steps as frame sequences ``[STACK - 1 + episode + 1, H, W]`` (the reset
    frame repeated ``STACK - 1`` times in front, as ``FrameStackObservation`` pads): step ``t``'s ``obs`` is
    ``seq[t : t + STACK]`` and its ``next_obs`` ``seq[t + 1 : t + 1 + STACK]`` (views: no copies)."""
    out, j = [], 0
    for _ in range(k):
        body = frames[np.arange(j, j + episode + 1) % len(frames)]
        j += episode + 1
        out.append(np.concatenate([np.repeat(body[:1], STACK - 1, axis=0), body]))
    return out


def steps(frames: np.ndarray, n, episode: int, channel_last: bool = False):
    """Transitions (dicts: obs / next_obs stacks as views, action, reward, done), episode after episode cycling
    a few episodes of ``frames``; ``n`` of them (None: without end). ``channel_last``: stacks ``[H, W, STACK]``
    (cpprb's ``stack_compress`` stacks along the last axis), else ``[STACK, H, W]`` (gymnasium's)."""
    eps = episodes(frames, episode)
    if channel_last:  # contiguous [H, W, STACK] stacks, as a channel-last wrapper hands them out
        eps = [
            np.ascontiguousarray(np.stack([np.moveaxis(e[i : i + STACK], 0, -1) for i in range(len(e) - STACK + 1)]))
            for e in eps
        ]
    t = 0
    while n is None or t < n:
        seq = eps[(t // episode) % len(eps)]
        i = t % episode
        if channel_last:
            obs, nxt = seq[i], seq[i + 1]
        else:
            obs, nxt = seq[i : i + STACK], seq[i + 1 : i + 1 + STACK]
        yield {'obs': obs, 'next_obs': nxt, 'action': t % 6, 'reward': float(t % 3 == 0), 'done': i == episode - 1}
        t += 1


def ours(kind: str, capacity: int, n_step: int = 1):
    from ding_buffer import create_buffer

    return create_buffer(
        dict(type=kind, replay_buffer_size=capacity, seed=0, storage=dict(type='tensor', frames=dict(n_step=n_step)))
    )


def cpprb_buffer(prioritized: bool, capacity: int):
    from cpprb import PrioritizedReplayBuffer, ReplayBuffer

    # cpprb's stack_compress takes stacks along the last axis: [H, W, STACK]
    env = {'obs': {'shape': (SIDE, SIDE, STACK), 'dtype': np.uint8}, 'act': {'dtype': np.int64}, 'rew': {}, 'done': {}}
    cls = PrioritizedReplayBuffer if prioritized else ReplayBuffer
    return cls(capacity, env_dict=env, next_of='obs', stack_compress='obs')


def time_it(fn, seconds: float) -> float:
    """Microseconds per call of ``fn`` (called repeatedly for about ``seconds``, the garbage collector paused)."""
    gc.collect()
    gc.disable()
    try:
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            dt = time.perf_counter() - t0
            if dt > seconds and n >= 5:
                return dt / n * 1e6
    finally:
        gc.enable()


def rounds(args, frames):
    cap = args.capacity
    fill = list(steps(frames, cap, args.episode))  # views into a few episodes' frames
    peers = {}
    for kind in ('naive', 'advanced'):
        b = ours(kind, cap)
        for s in fill:
            b.push(s)
        peers[f'ours {kind}'] = b
    b3 = ours('advanced', cap, n_step=3)
    for s in fill:
        b3.push(s)
    have_cpprb = True
    try:
        fill_last = list(steps(frames, cap, args.episode, channel_last=True))
        for pr in (False, True):
            rb = cpprb_buffer(pr, cap)
            for s in fill_last:
                rb.add(obs=s['obs'], act=s['action'], rew=s['reward'], next_obs=s['next_obs'], done=s['done'])
                if s['done']:
                    rb.on_episode_end()
            peers[f"cpprb {'PER' if pr else 'uniform'}"] = rb
    except ImportError:
        have_cpprb = False
    # each peer's stream goes on where its fill ended (a stream must not jump back: ours refuses that)
    cont = {name: steps(frames, None, args.episode, channel_last=name.startswith('cpprb')) for name in peers}
    for it in cont.values():
        for _ in range(cap):
            next(it)
    obs = np.stack([s['obs'] for s in fill])
    nxt = np.stack([s['next_obs'] for s in fill])
    rng = np.random.default_rng(0)
    results = {}

    def record(name, us):
        results.setdefault(name, []).append(us)

    for _ in range(args.rounds):
        for kind in ('naive', 'advanced'):
            b, it = peers[f'ours {kind}'], cont[f'ours {kind}']
            record(f'push one step: ours {kind}', time_it(lambda b=b, it=it: b.push(next(it)), args.seconds))
        if have_cpprb:
            for name in ('cpprb uniform', 'cpprb PER'):
                rb, it = peers[name], cont[name]

                def add(rb=rb, it=it):
                    s = next(it)
                    rb.add(obs=s['obs'], act=s['action'], rew=s['reward'], next_obs=s['next_obs'], done=s['done'])
                    if s['done']:
                        rb.on_episode_end()

                record(f'push one step: {name}', time_it(add, args.seconds))
        record('sample 256: ours naive', time_it(lambda: peers['ours naive'].sample(256, replace=True), args.seconds))
        record('sample 256: ours advanced', time_it(lambda: peers['ours advanced'].sample(256), args.seconds))
        record('sample 256: ours advanced n_step=3', time_it(lambda: b3.sample(256), args.seconds))
        if have_cpprb:
            for name in ('cpprb uniform', 'cpprb PER'):
                record(f'sample 256: {name}', time_it(lambda rb=peers[name]: rb.sample(256), args.seconds))

        def gather():
            i = rng.integers(0, cap, 256)
            return obs[i], nxt[i]

        record('sample 256: numpy gather of pre-stacked rows', time_it(gather, args.seconds))
    med = {k: statistics.median(v) for k, v in results.items()}
    return med, have_cpprb


def table(med, have_cpprb):
    rows = [('operation', 'ours (us)', 'reference', 'reference (us)', 'ours / reference speed')]

    def row(op, mine, ref_name, ref):
        if mine in med and ref in med:
            rows.append((op, f'{med[mine]:.1f}', ref_name, f'{med[ref]:.1f}', f'{med[ref] / med[mine]:.2f}x'))

    if have_cpprb:
        row(
            'push one step, naive',
            'push one step: ours naive',
            'cpprb ReplayBuffer.add',
            'push one step: cpprb uniform',
        )
        row('push one step, advanced', 'push one step: ours advanced', 'cpprb PER add', 'push one step: cpprb PER')
        row('sample 256, naive', 'sample 256: ours naive', 'cpprb sample', 'sample 256: cpprb uniform')
        row('sample 256, advanced', 'sample 256: ours advanced', 'cpprb PER sample', 'sample 256: cpprb PER')
    gather = 'sample 256: numpy gather of pre-stacked rows'
    row('sample 256, naive', 'sample 256: ours naive', 'numpy gather', gather)
    row('sample 256, advanced', 'sample 256: ours advanced', 'numpy gather', gather)
    row(
        'sample 256, advanced n_step=3',
        'sample 256: ours advanced n_step=3',
        'same, n_step=1',
        'sample 256: ours advanced',
    )
    width = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        print('| ' + ' | '.join(c.ljust(w) for c, w in zip(r, width)) + ' |')
        if r is rows[0]:
            print('|' + '|'.join('-' * (w + 2) for w in width) + '|')


def rss_child(peer: str, n: int, episode: int, frames_file: str) -> None:
    frames = np.load(frames_file)  # made by the parent: no emulator or OpenCV in this process's memory
    if peer == 'ours':
        import ding_buffer._numba as kernels
        import ding_buffer.buffers  # noqa: F401

        kernels.load()  # the compiled kernels a sample uses: their compiler's memory counts in the imports
    else:
        import cpprb  # noqa: F401
    base = _status()['VmRSS']  # the interpreter and the peer's imports, before its buffer
    if peer == 'ours':
        b = ours('advanced', n)
        for s in steps(frames, n, episode):
            b.push(s)
        per_item = b.storage.nbytes_per_item()
        count = b.count()
    else:
        rb = cpprb_buffer(True, n)
        for s in steps(frames, n, episode, channel_last=True):
            rb.add(obs=s['obs'], act=s['action'], rew=s['reward'], next_obs=s['next_obs'], done=s['done'])
            if s['done']:
                rb.on_episode_end()
        per_item, count = None, rb.get_stored_size()
    mem = _status()
    out = {'peer': peer, 'n': n, 'count': int(count), 'rss_bytes': mem['VmRSS'], 'bytes_per_item': per_item}
    out.update(anon_bytes=mem.get('RssAnon', 0), file_bytes=mem.get('RssFile', 0), imports_bytes=base)
    print(json.dumps(out))


def _status() -> dict:
    """This process's memory lines of /proc/self/status, in bytes."""
    with open('/proc/self/status') as f:
        return {
            line.split(':')[0]: int(line.split()[1]) * 1024
            for line in f
            if line.startswith(('VmRSS', 'RssAnon', 'RssFile'))
        }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--capacity', type=int, default=50_000)
    p.add_argument('--rounds', type=int, default=3)
    p.add_argument('--seconds', type=float, default=1.0, help='seconds each operation is timed per round')
    p.add_argument('--episode', type=int, default=1000, help='steps an episode')
    p.add_argument('--frames', choices=('pong', 'random'), default=None, help='default: pong when ale-py is there')
    p.add_argument('--rss', type=int, default=None, help='measure resident memory of N transitions instead')
    p.add_argument('--peers', default='ours,cpprb', help='(with --rss) which peers to measure')
    p.add_argument('--child', default=None, help=argparse.SUPPRESS)
    p.add_argument('--frames-file', default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:  # (before anything imports the emulator: only the buffer counts in this process)
        rss_child(args.child, args.rss, args.episode, args.frames_file)
        return
    if args.frames is None:
        try:
            import ale_py  # noqa: F401

            args.frames = 'pong'
        except ImportError:
            args.frames = 'random'
    import platform

    cpu = next((ln.split(':', 1)[1].strip() for ln in open('/proc/cpuinfo') if ln.startswith('model name')), '?')
    print(
        f"CPU: {cpu}; {os.cpu_count()} cores; Python {platform.python_version()}; frames: {args.frames}; "
        f"{time.strftime('%Y-%m-%d')}"
    )
    if args.rss:
        import tempfile

        frames_file = os.path.join(tempfile.mkdtemp(), 'frames.npy')
        np.save(frames_file, pong_frames() if args.frames == 'pong' else random_frames())
        for peer in args.peers.split(','):
            cmd = [
                sys.executable,
                __file__,
                '--child',
                peer,
                '--rss',
                str(args.rss),
                '--episode',
                str(args.episode),
                '--frames-file',
                frames_file,
            ]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode:
                print(f"{peer}: failed: {r.stderr.strip().splitlines()[-1:] or r.returncode}")
                continue
            d = json.loads(r.stdout.strip().splitlines()[-1])
            extra = f", {d['bytes_per_item']} bytes a transition in the storage" if d['bytes_per_item'] else ''
            print(
                f"{peer}: {d['count']:,} transitions, RSS {d['rss_bytes'] / 1e9:.2f} GB ({d['rss_bytes'] / 2**30:.2f} "
                f"GiB; anonymous {d['anon_bytes'] / 1e9:.2f} GB, files {d['file_bytes'] / 1e9:.2f} GB), of which the "
                f"interpreter and imports {d['imports_bytes'] / 1e9:.2f} GB{extra}"
            )
        return
    frames = pong_frames() if args.frames == 'pong' else random_frames()
    med, have_cpprb = rounds(args, frames)
    print(f"capacity {args.capacity:,}, episodes of {args.episode} steps, median of {args.rounds} rounds")
    table(med, have_cpprb)


if __name__ == '__main__':
    main()
