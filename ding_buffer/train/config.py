"""Training configs: DI-engine-style files (``main_config = dict(...)``) validated against ``TRAIN_DEFAULTS``.

A config file is plain Python that defines ``main_config``. Every key is checked (unknown key -> ``ValueError``
naming the file, the key and the closest valid key); the replay buffer section is validated by the buffer
class itself, after checking that the DQN trainer can use that buffer type at all, and ``policy.learn.batch_size``
must fit in the buffer. ``check_run_dir`` checks that the run directory can be made, before anything is made.
"""

import importlib.machinery
import importlib.util
import os
import re
from typing import Any, Dict, Mapping, Optional, Tuple

from easydict import EasyDict

from ..base import get_buffer_cls
from ..config import (
    STEPS_CHECK,
    build_config,
    check_section,
    check_str_keys,
    optional_positive_int,
    positive_int,
    seed_ok,
)
from ..datasets.config import checked_section as checked_dataset_section
from .run_dir import claiming, first_missing_dir

# Buffer types the DQN trainer can learn from: transition buffers whose tensor storage samples one dict of batched
# tensors. A class of your own (import_names) derived from one of them is accepted too.
# named in the trainer's error; any type declaring transitions sampled by learner iteration (elastic too) works
TRAINER_BUFFER_TYPES = ('advanced', 'naive')
BUFFER_SECTION = 'policy.other.replay_buffer.'

TRAIN_DEFAULTS = dict(
    # Run name; the run directory is <log_dir>/<exp_name>_seed<seed> (log_dir None: the working directory).
    exp_name='cartpole_dqn',
    log_dir=None,
    seed=0,
    env=dict(
        env_id='CartPole-v1',
        # Total environment steps of the run.
        max_env_step=50_000,
        # Greedy evaluation: episodes per evaluation and env steps between evaluations.
        eval_episodes=10,
        eval_freq=2_500,
        # A run counts as solved once the mean evaluation return reaches this.
        stop_value=475.0,
        # None, or 'atari': AtariPreprocessing (frame skip 4, 84x84 grey) + FrameStackObservation(4) on a
        # NoFrameskip env (the atari extra); observations are then uint8 frame stacks.
        wrapper=None,
        # Episode step limit passed to gym.make (None: the env's own).
        max_episode_steps=None,
    ),
    policy=dict(
        # 'cpu' or 'cuda' (the command line's --device overrides it).
        device='cpu',
        # 'mlp' (hidden_sizes) or 'nature_cnn' (the DQN paper's network, for frame stacks).
        model=dict(type='mlp', hidden_sizes=[128, 128]),
        discount_factor=0.99,
        # n-step TD targets (1 = plain one-step DQN).
        nstep=1,
        learn=dict(
            batch_size=64,
            learning_rate=1e-3,
            # Gradient steps per collected env step, and env steps collected before learning starts.
            updates_per_step=1,
            warmup_steps=1_000,
            # Learn every this many env steps (Atari DQN: 4).
            train_freq=1,
            # Hard target-network update every this many gradient steps.
            target_update_freq=500,
            # Double DQN target (online net picks the action, target net evaluates it).
            double=True,
            # Huber loss threshold; gradient-norm clip (None: no clipping).
            huber_delta=1.0,
            grad_clip=10.0,
        ),
        collect=dict(
            # Linear epsilon-greedy schedule over env steps.
            eps_start=1.0,
            eps_end=0.05,
            eps_decay_steps=10_000,
        ),
        other=dict(replay_buffer=dict(type='advanced')),
    ),
    checkpoint=dict(
        # Save every this many env steps (None: only at the end); keep the newest `keep`.
        freq=10_000,
        keep=2,
    ),
    # After training: `episodes` episodes of the trained policy (epsilon-greedy) written to `path` in the D4RL layout,
    # offline data for another run's buffer (a `dataset` section). 0 episodes: none.
    dataset_out=dict(path='dataset.hdf5', episodes=0, epsilon=0.05),
    # A dataset file this run's buffer loads that does not exist yet is first written by training this config (a
    # ready config's name or a file; its dataset_out.path is set to the missing file). None: a missing file is an error.
    dataset_source=None,
)


def device_ok(x: Any) -> bool:
    """A training device: 'cpu', 'cuda' or 'cuda:N' (the one rule of the config key and ``--device``)."""
    return isinstance(x, str) and re.fullmatch(r'cpu|cuda(:\d+)?', x) is not None


TRAIN_CHECKS = {
    'exp_name': (lambda x: isinstance(x, str) and x != '', 'a non-empty string'),
    'log_dir': (lambda x: x is None or (isinstance(x, str) and x != ''), 'None or a directory path'),
    'seed': (lambda x: x is not None and seed_ok(x), 'an int in [0, 2**63)'),  # the buffers' rule (none: drawn)
    'env.max_env_step': STEPS_CHECK,
    'env.eval_episodes': (positive_int, 'a positive int'),
    'env.eval_freq': (positive_int, 'a positive int'),
    'policy.device': (lambda x: device_ok(x), "'cpu' or 'cuda[:N]'"),
    'policy.discount_factor': (lambda x: 0 <= x <= 1, 'a number in [0, 1]'),
    'policy.nstep': (positive_int, 'a positive int'),
    'policy.learn.batch_size': (positive_int, 'a positive int'),
    'policy.learn.learning_rate': (lambda x: x > 0, 'a positive number'),
    'policy.learn.updates_per_step': (positive_int, 'a positive int'),
    'policy.learn.train_freq': (positive_int, 'a positive int'),
    'policy.model.type': (lambda x: x in ('mlp', 'nature_cnn'), "'mlp' or 'nature_cnn'"),
    'env.wrapper': (lambda x: x in (None, 'atari'), "None or 'atari'"),
    'env.max_episode_steps': (optional_positive_int, 'None or a positive int'),
    'policy.learn.warmup_steps': (lambda x: isinstance(x, int) and x >= 0, 'an int >= 0'),
    'policy.learn.target_update_freq': (positive_int, 'a positive int'),
    'policy.learn.huber_delta': (lambda x: x > 0, 'a positive number'),
    'policy.learn.grad_clip': (lambda x: x is None or x > 0, 'None or a positive number'),
    'policy.collect.eps_start': (lambda x: 0 <= x <= 1, 'a number in [0, 1]'),
    'policy.collect.eps_end': (lambda x: 0 <= x <= 1, 'a number in [0, 1]'),
    'policy.collect.eps_decay_steps': (positive_int, 'a positive int'),
    'policy.model.hidden_sizes': (
        lambda x: len(x) > 0 and all(positive_int(h) for h in x),
        'a non-empty list of positive ints',
    ),
    'checkpoint.freq': (optional_positive_int, 'None or a positive int'),
    'checkpoint.keep': (positive_int, 'a positive int'),
    'dataset_out.path': (lambda x: isinstance(x, str) and x != '', 'a file path'),
    'dataset_out.episodes': (lambda x: isinstance(x, int) and x >= 0, 'an int >= 0'),
    'dataset_out.epsilon': (lambda x: 0 <= x <= 1, 'a number in [0, 1]'),
    'dataset_source': (lambda x: x is None or (isinstance(x, str) and x != ''), 'None or a training config'),
}


def load_config_file(path: str) -> Dict[str, Any]:
    """Execute a config file and return its ``main_config`` (``ValueError``/``FileNotFoundError`` naming the file)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"config file '{path}' does not exist")
    # any file name: a config need not end in .py (spec_from_file_location would return None for it)
    loader = importlib.machinery.SourceFileLoader('ding_buffer_user_config', path)
    spec = importlib.util.spec_from_loader('ding_buffer_user_config', loader)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # a syntax error or a crash in the user's file is bad input, not our bug
        raise ValueError(f"config file '{path}' could not be executed: {type(e).__name__}: {e}") from e
    cfg = getattr(module, 'main_config', None)
    if not isinstance(cfg, Mapping):
        raise ValueError(f"config file '{path}' must define main_config = dict(...), got {type(cfg).__name__}")
    return dict(cfg)


def build_train_config(user: Mapping, source: str = '<config>') -> EasyDict:
    """Merge ``user`` over ``TRAIN_DEFAULTS`` with validation; errors name ``source``."""
    try:
        rest, buffer_cfg = split_buffer_section(user)
        if buffer_cfg is not None and not isinstance(buffer_cfg, Mapping):
            raise ValueError(f"config key '{BUFFER_SECTION[:-1]}' must be a dict, got {buffer_cfg!r:.40}")
        buffer_cfg = dict(buffer_cfg or {})
        cfg = build_config(TRAIN_DEFAULTS, rest, TRAIN_CHECKS)
    except (ValueError, TypeError) as e:
        raise type(e)(f"{source}: {e}") from e
    if buffer_cfg.get('type') is None:  # omitted: the defaults' type, as for every other key
        buffer_cfg['type'] = TRAIN_DEFAULTS['policy']['other']['replay_buffer']['type']
    _check_buffer_section(cfg, buffer_cfg, source)
    frames = (buffer_cfg.get('storage') or {}).get('frames')
    if frames is not None and cfg.policy.nstep > 1:  # the trainer's n-step items are not one stream's steps
        raise ValueError(
            f"{source}: config key 'policy.nstep' is {cfg.policy.nstep}, but with '{BUFFER_SECTION}storage.frames' "
            f"the buffer stores single steps and builds n-step returns itself: set policy.nstep=1 and "
            f"{BUFFER_SECTION}storage.frames.n_step={cfg.policy.nstep}"
        )
    datasets = [(where, s['dataset']) for where, s in buffer_sections(buffer_cfg) if s.get('dataset') is not None]
    for where, section in datasets:  # checked now: a typo must not wait for a dataset_source run to be found
        try:
            checked_dataset_section(section)
        except ValueError as e:
            named = str(e).replace("'dataset", f"'{BUFFER_SECTION}{where}dataset")
            raise ValueError(f"{source}: {named}") from e
    if cfg.policy.nstep > 1 and datasets:
        raise ValueError(
            f"{source}: config key 'policy.nstep' is {cfg.policy.nstep}, but the buffer loads a dataset of one-step "
            f"transitions (a 'dataset' section), which n-step items cannot be mixed with: set policy.nstep=1"
        )
    cfg.policy.other.replay_buffer = EasyDict(buffer_cfg)
    return cfg


def _check_buffer_section(cfg: EasyDict, buffer_cfg: dict, source: str) -> None:
    """Validate the buffer section now, so a typo fails before anything is created on disk."""
    try:
        cls = get_buffer_cls(EasyDict(buffer_cfg))
        caps = cls.capabilities()  # declared by the type: transitions, sampled with the learner's iteration
        if caps['item_kind'] != 'transition' or 'cur_learner_iter' not in caps['sample_kwargs']:
            raise ValueError(
                f"config key '{BUFFER_SECTION}type' is {buffer_cfg['type']!r} ({cls.__name__}), which the DQN "
                f"trainer cannot use: it supports {' or '.join(repr(t) for t in TRAINER_BUFFER_TYPES)}, and every "
                "other type of transitions sampled by the learner's iteration ('elastic', 'mixture', your own)"
            )
        full = check_section(cls, buffer_cfg, BUFFER_SECTION)
        batch = cfg.policy.learn.batch_size
        if batch > full.get('replay_buffer_size', batch):  # (a mixture has no size of its own: each member has one)
            where = '' if 'replay_buffer_size' in buffer_cfg else " (the buffer type's default)"
            raise ValueError(
                f"config key 'policy.learn.batch_size' = {batch} is larger than '{BUFFER_SECTION}replay_buffer_size' "
                f"= {full.replay_buffer_size}{where}: a batch of {batch} can never be sampled, so no gradient step "
                "would run; expected batch_size <= replay_buffer_size"
            )
    except (ValueError, TypeError) as e:
        msg = str(e).replace("config key 'type'", f"config key '{BUFFER_SECTION}type'")
        raise type(e)(f"{source}: {msg}") from e


def buffer_sections(buffer_cfg: Mapping) -> list:
    """``(where, section)`` of a buffer section (where '') and, for a mixture, of its members' (``members.<name>.``)."""
    members = buffer_cfg.get('members') if buffer_cfg.get('type') == 'mixture' else None
    return [('', buffer_cfg)] + [(f'members.{n}.', m) for n, m in (members or {}).items() if isinstance(m, Mapping)]


def with_env_steps(user: Dict[str, Any], env_steps: int) -> None:
    """``--env-steps``: ``env.max_env_step`` of the user's config set to ``env_steps`` (``env=None`` is the default
    section; an ``env`` that is not a dict is left as it is, for the config check to name)."""
    env = user.get('env')
    if env is None or isinstance(env, Mapping):
        user['env'] = dict(env or {}, max_env_step=env_steps)


def run_dir_of(cfg: EasyDict) -> str:
    """The run directory ``<log_dir>/<exp_name>_seed<seed>`` (log_dir None: the working directory)."""
    return os.path.join(cfg.log_dir or '.', f'{cfg.exp_name}_seed{cfg.seed}')


def check_run_dir(run_dir: str, log_dir: Optional[str]) -> None:
    """
    Overview:
        ``ValueError`` naming the key and the path when ``run_dir`` (inside ``log_dir``) cannot be created or
        written: a part of the path exists but is not a directory, or the nearest existing directory is not
        writable. Nothing is created.
    """
    top = first_missing_dir(run_dir)
    path = os.path.abspath(run_dir) if top is None else os.path.dirname(top)  # the nearest existing directory
    key = (
        "the run directory (config keys 'log_dir', 'exp_name', 'seed')"
        if top is None
        else f"config key 'log_dir' ({log_dir!r})"
    )
    if not os.path.isdir(path):
        raise ValueError(f"{key}: cannot create run directory '{run_dir}': '{path}' exists and is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"{key}: cannot create run directory '{run_dir}': '{path}' is not writable")


def check_new_run_dir(run_dir: str, log_dir: Optional[str]) -> None:
    """``check_run_dir``, and ``ValueError`` when ``run_dir`` already holds checkpoints (``check_checkpoints``)."""
    from .checkpoint import check_checkpoints

    check_run_dir(run_dir, log_dir)
    check_checkpoints(run_dir, resume=False)


def make_trainer(trainer_cls: Any, cfg: EasyDict, run_dir: str, args: Any, **kwargs: Any) -> Any:
    """A ``trainer_cls`` for ``run_dir`` (a new run's directory checked first) with the command line's ``--resume``
    and ``--no-progress`` (``args``) and ``kwargs``; a bad setting names the config."""
    try:
        if args.resume is None:
            check_run_dir(run_dir, cfg.log_dir)
        with claiming():  # (one trainer per run directory)
            return trainer_cls(cfg, run_dir, resume=args.resume is not None, progress=not args.no_progress, **kwargs)
    except ValueError as e:
        raise ValueError(f"{args.config}: {e}") from e


def _section(parent: Mapping, key: str, name: str) -> Dict[str, Any]:
    """``parent[key]`` as a new dict ({} when absent or None); ``ValueError`` naming ``name`` when it is not one."""
    value = parent.get(key)
    if value is not None and not isinstance(value, Mapping):
        raise ValueError(f"config key '{name}' must be a dict, got {type(value).__name__} {value!r:.40}")
    return dict(value or {})


def split_buffer_section(user: Mapping) -> Tuple[Dict[str, Any], Any]:
    """``(user without policy.other.replay_buffer, that section)`` (the section is None when absent): every job
    validates its own keys and lets the buffer class validate its section."""
    user = dict(user)
    policy = _section(user, 'policy', 'policy')
    other = _section(policy, 'other', 'policy.other')
    buffer_cfg = other.pop('replay_buffer', None)  # (checked by each job: a str there says what it expects)
    if isinstance(buffer_cfg, Mapping):
        check_str_keys(buffer_cfg, BUFFER_SECTION)  # (before any EasyDict of it: it fails on such keys naming none)
    if 'other' in policy:
        policy['other'] = other
    if 'policy' in user:
        user['policy'] = policy
    return user, buffer_cfg
