"""``storage.frames`` on real Atari frames: Pong through gymnasium's ``AtariPreprocessing`` and
``FrameStackObservation`` (the ``atari`` extra), two environments stepped round robin with short time limits, so
the stream holds truncations, resets and ring wrap-around. Every sample equals the stacks the wrappers produced
(kept in full as the brute-force reference), 1-step and n-step, uniform and prioritized."""

import os

import numpy as np
import pytest
from helpers import n_step_reference

from ding_buffer import create_buffer


def _atari():
    try:
        import ale_py
        import cv2  # noqa: F401 - AtariPreprocessing needs it
        import gymnasium as gym
    except ImportError as e:
        if os.environ.get('CI'):  # CI installs the atari extra: a missing module is a broken install there
            raise
        pytest.skip(f"the atari extra is not installed ({e})")
    gym.register_envs(ale_py)
    return gym


def pong_steps(n_envs=2, steps=240, limit=50, seed=0):
    gym = _atari()
    envs = []
    for e in range(n_envs):
        env = gym.make('PongNoFrameskip-v4', max_episode_steps=limit * 4)  # (the limit counts raw frames)
        env = gym.wrappers.FrameStackObservation(gym.wrappers.AtariPreprocessing(env, frame_skip=4), 4)
        envs.append(env)
    obs = [env.reset(seed=seed + e)[0] for e, env in enumerate(envs)]
    rng = np.random.default_rng(seed)
    out = []
    for k in range(steps):
        e = k % n_envs
        action = int(rng.integers(envs[e].action_space.n))
        nxt, reward, term, trunc, _ = envs[e].step(action)
        out.append(
            dict(
                obs=obs[e],
                action=action,
                reward=float(reward),
                next_obs=nxt,
                done=bool(term),
                truncated=bool(trunc),
                env_id=e,
                step=k,
            )
        )
        obs[e] = envs[e].reset()[0] if term or trunc else nxt
    for env in envs:
        env.close()
    return out


@pytest.fixture(scope='module')
def pong():
    return pong_steps()


@pytest.mark.parametrize('n_step', [1, 3])
@pytest.mark.parametrize('type_', ['naive', 'advanced', 'elastic', 'deque'])
def test_real_pong_frames_come_back_exactly(pong, type_, n_step):
    assert any(t['truncated'] for t in pong)  # episodes ended inside the stream
    assert np.array_equal(pong[0]['obs'][0], pong[0]['obs'][3])  # the wrappers repeat the reset frame
    buf = create_buffer(
        dict(
            type=type_,
            replay_buffer_size=128,  # 240 steps: the ring wraps
            seed=0,
            storage=dict(type='tensor', frames=dict(env_key='env_id', n_step=n_step, gamma=0.9)),
        )
    )
    for i in range(0, len(pong), 2):  # as a vectorised collector pushes: one row per env
        rows = pong[i : i + 2]
        buf.extend({k: np.stack([np.asarray(t[k]) for t in rows]) for k in rows[0]})
    assert buf.count() == 128
    pushed = {t['step']: t for t in pong}
    ref = n_step_reference(pong, n_step, 0.9)
    out = buf.sample(128, replace=False) if type_ in ('naive', 'elastic') else buf.sample(128)
    for j, s in enumerate(out['step'].tolist()):
        assert s >= len(pong) - 128
        assert np.array_equal(out['obs'][j].numpy(), pushed[s]['obs'])
        ret, nxt, _, _, k = ref[s]
        assert np.array_equal(out['next_obs'][j].numpy(), nxt)
        assert out['reward'][j].item() == pytest.approx(ret, abs=1e-5)
        if n_step > 1:
            assert out['n_step'][j].item() == k
    storage = (buf.inner if type_ == 'deque' else buf).storage  # (a deque keeps its items in an inner buffer)
    assert storage.nbytes_per_item() < 84 * 84 * 1.3  # about one frame a transition (not 8)


@pytest.mark.parametrize('type_', ['episode', 'prioritized_episode'])
def test_real_pong_episodes_come_back_exactly(pong, type_):
    """The same Pong steps cut into each environment's episodes and pushed whole (sequence replay): every window
    equals the wrappers' stacks; the oldest episodes leave as the table fills."""
    episodes, current = [], {0: [], 1: []}
    for t in pong:
        current[t['env_id']].append(dict(t, reward=np.float32(t['reward'])))
        if t['done'] or t['truncated']:
            episodes.append(current[t['env_id']])
            current[t['env_id']] = []
    assert len(episodes) >= 4
    cfg = dict(type=type_, replay_buffer_size=3, max_transitions=120, seed=0, storage=dict(type='tensor', frames={}))
    if type_ == 'prioritized_episode':
        cfg['sampler'] = dict(unroll_len=8)
    buf = create_buffer(cfg)
    for ep in episodes:
        buf.push([ep])
    assert buf.count() >= 2 and buf.transition_count <= 120  # (episodes of up to 50 steps)
    pushed = {t['step']: t for t in pong}
    out = buf.sample(16, unroll_len=8) if type_ == 'episode' else buf.sample(16)
    assert out['mask'].all()
    for i in range(16):
        steps = out['step'][i].tolist()
        assert all(pushed[b]['env_id'] == pushed[a]['env_id'] for a, b in zip(steps, steps[1:]))
        for j, s in enumerate(steps):
            assert np.array_equal(out['obs'][i, j].numpy(), pushed[s]['obs'])
            assert np.array_equal(out['next_obs'][i, j].numpy(), pushed[s]['next_obs'])
    assert buf.storage.nbytes_per_item() < 84 * 84 * 1.3
