"""The gymnasium environments of the DQN jobs: ``make_env(cfg.env)`` builds ``env.env_id`` with the wrappers the
config names (``env.wrapper``): None, or ``'atari'`` -- ``AtariPreprocessing`` (frame skip 4, 84 x 84 grey, no-op
starts) and ``FrameStackObservation`` (4 frames, the reset frame repeated at an episode's start), the usual DQN
preprocessing; observations are then ``[4, 84, 84]`` uint8 stacks, what ``storage.frames`` stores once.
"""

from typing import Any

WRAPPERS = (None, 'atari')


def make_env(env_cfg: Any) -> Any:
    """A new environment for ``env_cfg`` (``env_id``, ``wrapper``, ``max_episode_steps``); ``ValueError`` naming
    the key when gymnasium cannot make it (a missing extra is named too)."""
    import gymnasium as gym

    kwargs = {} if env_cfg.get('max_episode_steps') is None else {'max_episode_steps': env_cfg.max_episode_steps}
    wrapper = env_cfg.get('wrapper')
    if wrapper == 'atari':
        try:
            import ale_py
        except ImportError as e:
            raise ValueError(
                "config key 'env.wrapper' is 'atari', which needs the atari extra (pip install 'ding_buffer[atari]')"
            ) from e
        gym.register_envs(ale_py)
    try:
        env = gym.make(env_cfg.env_id, **kwargs)
    except gym.error.Error as e:
        raise ValueError(f"config key 'env.env_id': cannot make {env_cfg.env_id!r}: {e}") from e
    if wrapper == 'atari':
        try:
            env = gym.wrappers.AtariPreprocessing(env, frame_skip=4, screen_size=84, grayscale_obs=True)
        except (ValueError, gym.error.Error) as e:  # e.g. frame skip twice (an env_id that already skips frames)
            raise ValueError(
                f"config key 'env.env_id': {env_cfg.env_id!r} cannot take the 'atari' wrappers ({e}); use a "
                "NoFrameskip version, e.g. 'PongNoFrameskip-v4'"
            ) from e
        env = gym.wrappers.FrameStackObservation(env, 4)
    return env


__all__ = ['WRAPPERS', 'make_env']
