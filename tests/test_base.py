"""IBuffer contract, BUFFER_REGISTRY, create_buffer / get_buffer_cls, config merging and validation."""

import logging
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from easydict import EasyDict
from helpers import subprocess_env

import ding_buffer
from ding_buffer import BUFFER_REGISTRY, IBuffer, create_buffer, get_buffer_cls
from ding_buffer.base import Registry
from ding_buffer.buffers import EpisodeReplayBuffer, NaiveReplayBuffer
from ding_buffer.utils import deep_merge_dicts


def test_registry_has_presets_and_refuses_duplicates():
    assert BUFFER_REGISTRY.get('naive') is NaiveReplayBuffer
    assert BUFFER_REGISTRY.get('episode') is EpisodeReplayBuffer
    reg = Registry()

    @reg.register('x')
    class X:
        pass

    assert reg.get('x') is X
    with pytest.raises(ValueError, match="'x' is already registered"):
        reg.register('x')(type('Y', (), {}))
    assert reg.get('x') is X
    assert isinstance(reg.build('x'), X)


def test_registry_takes_a_redefinition_of_the_same_class_or_replace_but_never_over_a_builtin():
    """A notebook cell run twice defines the same class again: registered again without a flag; another class
    under a taken name needs replace=True; ding_buffer's own classes are never replaced."""
    reg = Registry()

    def define(body):
        return type('Parts', (), {'__module__': 'notebook', 'body': body})

    first, again = define(1), define(2)
    reg.register('p')(first)
    reg.register('p')(again)  # same module and name: the cell ran again
    assert reg.get('p') is again
    other = type('Other', (), {'__module__': 'notebook'})
    with pytest.raises(ValueError, match="pass replace=True"):
        reg.register('p')(other)
    reg.register('p', replace=True)(other)
    assert reg.get('p') is other
    mine = type('NaiveReplayBuffer', (), {'__module__': 'notebook'})
    with pytest.raises(ValueError, match="'naive' is already registered"):
        BUFFER_REGISTRY.register('naive', replace=True)(mine)
    assert BUFFER_REGISTRY.get('naive') is NaiveReplayBuffer


def test_unknown_names_suggest_the_closest_registered_one():
    with pytest.raises(ValueError, match="did you mean 'advanced'"):
        create_buffer(dict(type='advnced'))
    with pytest.raises(ValueError) as e:
        create_buffer(dict(type='zzz'))
    assert 'did you mean' not in str(e.value)  # nothing close: no guess


def test_unknown_type_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown buffer type 'nave'.*naive"):
        create_buffer(dict(type='nave'))
    with pytest.raises(ValueError, match="no 'type' key"):
        create_buffer(dict(replay_buffer_size=3))
    with pytest.raises(TypeError):
        create_buffer(['naive'])


@pytest.mark.parametrize('cfg', [dict(type=['naive']), dict(type={'name': 'naive'})])
def test_an_unhashable_type_is_refused_naming_the_key(cfg):
    with pytest.raises(ValueError, match=r"unknown buffer type .*\(config key 'type'\)"):
        create_buffer(cfg)
    mixture = dict(type='mixture', members=dict(a=cfg, b=dict(type='naive')))
    with pytest.raises(ValueError, match=r"member 'a'.*config key 'type'"):
        create_buffer(mixture)


@pytest.mark.parametrize(
    'cfg, given, key',
    [
        (dict(type='chunk', max_use=float('inf')), 'max_use', 'max_reuse'),
        (dict(type='chunk', max_use=0), 'max_use', 'max_reuse'),
        (dict(type='gfn', capacity=0), 'capacity', 'replay_buffer_size'),
        (dict(type='gfn', capacity='x'), 'capacity', 'replay_buffer_size'),
    ],
)
def test_a_bad_value_given_under_an_alias_names_the_key_the_user_wrote(cfg, given, key):
    with pytest.raises((TypeError, ValueError), match=rf"config key '{key}' \(given as '{given}'\)"):
        create_buffer(cfg)
    with pytest.raises(ValueError) as typo:  # an error about another key carries no note, whatever it names
        create_buffer(dict(cfg, **{given: 3, key[:4] + 'x': 1}))
    assert 'given as' not in str(typo.value)


def test_create_buffer_honours_import_names(tmp_path, monkeypatch):
    (tmp_path / 'my_custom_buffer_mod.py').write_text(
        textwrap.dedent(
            """
            from ding_buffer import BUFFER_REGISTRY
            from ding_buffer.buffers import NaiveReplayBuffer

            @BUFFER_REGISTRY.register('my_custom')
            class MyCustomBuffer(NaiveReplayBuffer):
                config = dict(NaiveReplayBuffer.config, type='my_custom')
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = EasyDict(type='my_custom', import_names=['my_custom_buffer_mod'], replay_buffer_size=3)
    try:
        cls = get_buffer_cls(cfg)
        assert cls.__name__ == 'MyCustomBuffer'
        buf = create_buffer(cfg, exp_name='e', instance_name='custom')
        buf.push([{'a': i} for i in range(5)])
        assert buf.count() == 3 and buf.instance_name == 'custom'
    finally:
        BUFFER_REGISTRY.pop('my_custom', None)


@pytest.mark.parametrize('cls', [NaiveReplayBuffer, EpisodeReplayBuffer])
def test_default_config_is_a_tagged_copy(cls):
    cfg = cls.default_config()
    assert isinstance(cfg, EasyDict)
    assert cfg.cfg_type == cls.__name__ + 'Dict'
    assert cfg.type == {NaiveReplayBuffer: 'naive', EpisodeReplayBuffer: 'episode'}[cls]
    cfg.replay_buffer_size = -1
    cfg.storage.type = 'changed'
    assert cls.default_config().replay_buffer_size > 0
    assert cls.default_config().storage.type == 'list'


def test_deep_merge_dicts_is_recursive_and_does_not_mutate():
    a = EasyDict(x=1, sub=dict(p=1, q=2))
    b = dict(sub=dict(q=3, r=4), y=5)
    merged = deep_merge_dicts(a, b)
    assert merged == dict(x=1, y=5, sub=dict(p=1, q=3, r=4))
    assert isinstance(merged, EasyDict) and merged.sub.r == 4
    assert a.sub == dict(p=1, q=2) and b == dict(sub=dict(q=3, r=4), y=5)


def test_partial_config_is_merged_over_defaults():
    buf = create_buffer(dict(type='naive', replay_buffer_size=5))
    assert buf.cfg.deepcopy is False and buf.cfg.storage.type == 'list' and buf.replay_buffer_size == 5
    # a full DI-engine style config (with cfg_type) is accepted too
    full = deep_merge_dicts(NaiveReplayBuffer.default_config(), dict(replay_buffer_size=7))
    assert create_buffer(full).replay_buffer_size == 7


@pytest.mark.parametrize(
    'cfg, pattern',
    [
        (dict(replay_bufer_size=10), r"unknown config key 'replay_bufer_size'.*did you mean 'replay_buffer_size'"),
        (dict(storage=dict(typ='tensor')), r"unknown config key 'storage.typ'.*did you mean 'storage.type'"),
        (dict(replay_buffer_size='10'), r"'replay_buffer_size' has value '10' of type str; expected int"),
        (dict(replay_buffer_size=0), r"'replay_buffer_size' has invalid value 0; expected a positive int"),
        (dict(replay_buffer_size=2.5), r"'replay_buffer_size'.*expected int"),
        (dict(deepcopy=1), r"'deepcopy' has value 1 of type int; expected bool"),
        (
            dict(storage=dict(type='gpu')),
            r"'storage.type' has invalid value 'gpu'; expected one of \['list', 'tensor'\]",
        ),
        (dict(storage=dict(device='tpu')), r"'storage.device' has invalid value 'tpu'"),
        (dict(storage='tensor'), r"'storage' has value 'tensor' of type str; expected dict"),
        (dict(seed=-1), r"'seed' has invalid value -1"),
    ],
)
def test_bad_config_names_key_value_and_expectation(cfg, pattern):
    with pytest.raises(ValueError, match=pattern):
        create_buffer(dict(type='naive', **cfg))


def test_episode_specific_config_checks():
    with pytest.raises(ValueError, match="'max_transitions' must be set"):
        create_buffer(dict(type='episode', storage=dict(type='tensor')))
    with pytest.raises(ValueError, match="'enable_track_used_data'"):
        create_buffer(dict(type='episode', enable_track_used_data=True))
    with pytest.raises(ValueError, match="'storage.memmap_dir' needs storage.type='tensor'"):
        create_buffer(dict(type='episode', storage=dict(memmap_dir='/tmp/x')))
    with pytest.raises(ValueError, match="'storage.output'='batch' needs storage.type='tensor'"):
        create_buffer(dict(type='episode', storage=dict(type='list', output='batch')))  # (was accepted, ignored)


@pytest.mark.parametrize(
    'kind', ['naive', 'advanced', 'deque', 'elastic', 'episode', 'prioritized_episode', 'sequence', 'gfn']
)
def test_a_capacity_beyond_any_memory_is_refused_naming_the_key(kind):
    # refused by name at once, not by a MemoryError from the per-slot arrays; the largest accepted value is named
    with pytest.raises(
        ValueError, match=r"'replay_buffer_size' has invalid value 4611686018427387904.*at most 2\*\*40"
    ):
        create_buffer(dict(type=kind, replay_buffer_size=2**62))
    with pytest.raises(ValueError, match=r"'max_transitions'.*at most 2\*\*40"):
        create_buffer(dict(type='episode', max_transitions=2**41))


def test_track_used_data_needs_list_storage():
    with pytest.raises(ValueError, match="'enable_track_used_data' needs storage.type='list'"):
        create_buffer(dict(type='naive', enable_track_used_data=True, storage=dict(type='tensor')))


def test_constructor_signature_and_contract():
    for cls in (NaiveReplayBuffer, EpisodeReplayBuffer):
        assert issubclass(cls, IBuffer)
        buf = cls(cls.default_config(), None, 'exp', 'inst')
        for name in (
            'push',
            'sample',
            'update',
            'clear',
            'count',
            'state_dict',
            'load_state_dict',
            'save_data',
            'load_data',
            'start',
            'close',
        ):
            assert callable(getattr(buf, name))
        assert len(buf) == buf.count() == 0
        buf.close()


def test_context_manager_close_is_idempotent_and_final():
    with create_buffer(dict(type='naive', replay_buffer_size=4)) as buf:
        buf.push({'a': 1})
        assert len(buf) == 1
    buf.close()
    buf.close()
    with pytest.raises(RuntimeError, match='closed'):
        buf.push({'a': 2})
    assert buf.count() == 1


def test_logs_go_to_a_logger_named_after_the_instance(caplog):
    buf = create_buffer(dict(type='naive', replay_buffer_size=4), instance_name='my_learner_buffer')
    with caplog.at_level(logging.INFO, logger='ding_buffer.my_learner_buffer'):
        assert buf.sample(2) is None
    records = [r for r in caplog.records if r.name == 'ding_buffer.my_learner_buffer']
    assert records and 'buffer is empty' in records[0].getMessage()


def test_nothing_is_written_to_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for cfg in (dict(type='naive'), dict(type='episode', max_transitions=100, storage=dict(type='tensor'))):
        buf = create_buffer(cfg, exp_name='cwd_check')
        buf.push([{'x': 1.0}] if cfg['type'] == 'naive' else [{'x': [1.0, 2.0]}])
        buf.sample(1)
        buf.close()
    assert os.listdir(tmp_path) == []


def test_package_exports():
    for name in ('create_buffer', 'get_buffer_cls', 'IBuffer', 'BUFFER_REGISTRY', 'deep_merge_dicts'):
        assert hasattr(ding_buffer, name)


@pytest.mark.slow
def test_import_loads_neither_numba_nor_tensorboard_and_kernels_load_in_the_background():
    """``import ding_buffer`` stays light (issue: 2.9 s with numba); the first prioritized operation starts loading
    the compiled kernels in a background thread and is served by the numpy fallbacks meanwhile; once loaded,
    the dispatchers serve every module (no stand-in left in any ding_buffer module)."""
    import subprocess
    import sys

    script = (
        "import sys, time, ding_buffer\n"
        "print('numba' in sys.modules, any(m.startswith('tensorboard') for m in sys.modules))\n"
        "b = ding_buffer.create_buffer(dict(type='advanced', replay_buffer_size=64, seed=0))\n"
        "b.push([{'x': i, 'priority': float(i + 1)} for i in range(8)])\n"
        "print(len(b.sample(4, 0)))\n"
        "from ding_buffer import tree_kernels, _numba\n"
        "deadline = time.monotonic() + 100\n"
        "while not _numba.ready() and _numba.HAVE_NUMBA and time.monotonic() < deadline:\n"
        "    time.sleep(0.02)\n"
        "print(type(tree_kernels.prio_set_many).__name__)\n"
        "left = [f'{n}.{a}' for n, m in list(sys.modules.items()) if n.startswith('ding_buffer') and m is not None\n"
        "        for a, v in vars(m).items() if isinstance(v, _numba._Kernel)]\n"
        "print(left)\n"
        "print(len(b.sample(4, 0)))\n"
    )
    out = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=150)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.split('\n')
    assert lines[0] == 'False False' and lines[1] == '4' and lines[4] == '4', lines
    from ding_buffer import _numba

    if _numba.HAVE_NUMBA:
        assert lines[2] == 'CPUDispatcher'  # the stand-in was replaced in its module
        assert lines[3] == '[]', lines[3]


@pytest.mark.slow
def test_kernels_compile_in_memory_where_numba_has_nowhere_to_cache_them():
    """A read-only install and home: numba finds no place for its on-disk cache (simulated by taking away its
    cache locators). The kernels still compile, in memory, instead of every one falling back to numpy."""
    from ding_buffer import _numba

    if not _numba.HAVE_NUMBA:
        pytest.skip('numba is not installed')
    script = (
        "import logging, numpy as np\n"
        "import numba.core.caching as caching\n"
        "caching.CacheImpl._locator_classes = []  # (numba then raises 'no locator available' for cache=True)\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "from ding_buffer import create_buffer, _numba, tree_kernels\n"
        "b = create_buffer(dict(type='advanced', replay_buffer_size=100, seed=3, storage=dict(type='tensor')))\n"
        "b.extend({'x': np.arange(40, dtype=np.float32).reshape(20, 2)})\n"
        "_numba.load()\n"
        "print(sorted({type(v).__name__ for v in vars(tree_kernels).values() if hasattr(v, 'py_func')}))\n"
    )
    out = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split('\n')[0] == "['CPUDispatcher']" and 'failed' not in out.stderr, out.stderr[-2000:]


_FORK_SCRIPT = r'''
import json, os, sys, numpy as np
from ding_buffer import create_buffer, _numba
mode = sys.argv[1]
if mode == 'broken':
    def broken(pending):
        raise RuntimeError('simulated compiler failure')
    _numba._compile = broken
b = create_buffer(dict(type='advanced', replay_buffer_size=100, seed=3, storage=dict(type='tensor')))
b.extend({'x': np.arange(40, dtype=np.float32).reshape(20, 2)})  # starts the background load
out = {}
if mode == 'fork':
    r, w = os.pipe()
    pid = os.fork()  # while the kernels load: the fork waits for the load, the child must not deadlock
    if pid == 0:
        s = b.sample(8)
        b.update({'replay_unique_id': s['replay_unique_id'], 'replay_buffer_idx': s['replay_buffer_idx'],
                  'priority': np.full(8, 2.0, np.float32)})
        os.write(w, json.dumps(b.sample(8)['replay_unique_id'].tolist()).encode())
        os._exit(0)
    os.close(w)
    child = json.loads(os.read(r, 10000).decode())
    os.waitpid(pid, 0)
    out['child'] = child
_numba.load()
s = b.sample(8)
b.update({'replay_unique_id': s['replay_unique_id'], 'replay_buffer_idx': s['replay_buffer_idx'],
          'priority': np.full(8, 2.0, np.float32)})
out['parent'] = b.sample(8)['replay_unique_id'].tolist()
out['ready'] = _numba.ready()
print('RESULT ' + json.dumps(out))
'''


@pytest.mark.slow
@pytest.mark.parametrize('mode', ['fork', 'broken', 'plain'])
def test_background_kernel_load_survives_fork_and_compiler_failure(mode):
    """A fork while the kernels load in the background gives a child that samples and updates (no lock
    inherited half-held) with the same results as its parent; a compiler that fails leaves the numpy / Python
    versions serving with a warning, never a retry loop, and the same results as a normal run."""
    import json
    import subprocess
    import sys

    if mode == 'fork' and not hasattr(os, 'fork'):
        pytest.skip('no fork on this platform')
    runs = {}
    for m in ('plain', mode):
        proc = subprocess.run([sys.executable, '-c', _FORK_SCRIPT, m], capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[m] = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith('RESULT '))[7:])
        if m == 'broken':
            assert 'compiling the numba kernels failed' in proc.stderr or not ding_buffer._numba.HAVE_NUMBA
            assert runs[m]['ready'] is False
    assert runs[mode]['parent'] == runs['plain']['parent']
    if mode == 'fork':
        assert runs['fork']['child'] == runs['plain']['parent']


@pytest.mark.slow
def test_the_lazy_registry_loads_the_presets_before_any_read_or_register():
    """`import ding_buffer` registers the built-in types on first use; a read of the registry, or a register,
    in a fresh process sees them (so a user's type cannot take a built-in name and break every later build)."""
    import subprocess
    import sys

    code = (
        "from ding_buffer.base import BUFFER_REGISTRY, create_buffer\n"
        "assert 'advanced' in BUFFER_REGISTRY and 'naive' in sorted(BUFFER_REGISTRY)\n"
        "class Mine: pass\n"
        "try:\n"
        "    BUFFER_REGISTRY.register('advanced')(Mine)\n"
        "    raise SystemExit('a built-in name was taken')\n"
        "except ValueError as e:\n"
        "    assert 'already registered (by AdvancedReplayBuffer)' in str(e)\n"
        "BUFFER_REGISTRY.register('mine')(Mine)\n"
        "assert type(create_buffer({'type': 'naive'})).__name__ == 'NaiveReplayBuffer'\n"
        "assert BUFFER_REGISTRY['mine'] is Mine\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == 'ok', proc.stderr


@pytest.mark.parametrize('buffer_type', sorted(BUFFER_REGISTRY.keys()))
@pytest.mark.parametrize('seed', [True, -1, 2**63, 1.0, '0'])
def test_every_type_checks_its_seed_the_same_way(buffer_type, seed):
    """One seed rule for every type: None or an int in [0, 2**63); a bool is not a seed."""
    with pytest.raises(ValueError, match=r"config key 'seed'.*None or an int in \[0, 2\*\*63\)"):
        create_buffer(dict(type=buffer_type, seed=seed))


@pytest.mark.parametrize('buffer_type', sorted(BUFFER_REGISTRY.keys()))
@pytest.mark.parametrize('seed', [0, 2**63 - 1, np.int64(3), np.uint64(2**63 - 1)])
def test_every_type_takes_every_int_seed(buffer_type, seed):
    buf = create_buffer(dict(type=buffer_type, seed=seed))
    assert buf.count() == 0
    buf.close()


def test_the_training_jobs_seed_follows_the_buffers_rule():
    """Was: the DQN job took seed=2**63, which its buffer (seeded from it) then refused at build, naming a key the
    user never set."""
    from ding_buffer.train.config import build_train_config

    for seed in (2**63, -1, None):
        with pytest.raises(ValueError, match="config key 'seed'"):
            build_train_config(dict(seed=seed, policy=dict(other=dict(replay_buffer=dict(type='advanced')))))
    top = build_train_config(dict(seed=2**63 - 1, policy=dict(other=dict(replay_buffer=dict(type='advanced')))))
    assert top.seed == 2**63 - 1


def test_numpy_numbers_are_accepted_wherever_their_python_numbers_are():
    """np.int64 sizes and limits (what a config computed with numpy holds) were refused where the same number as
    a Python int was taken, and np.True_ was 'not a bool'; the config then holds plain Python numbers."""
    import numpy as np

    buf = create_buffer(
        dict(type='naive', replay_buffer_size=np.int64(8), max_use=np.int64(2), seed=np.int64(3), deepcopy=np.False_)
    )
    assert buf.replay_buffer_size == 8 and type(buf.cfg.replay_buffer_size) is int and buf.cfg.deepcopy is False
    buf.push([{'obs': i} for i in range(4)])
    assert len(buf.sample(np.int64(2), replace=np.True_)) == 2
    mix = create_buffer(
        dict(
            type='mixture',
            members=dict(a=dict(type='naive'), b=dict(type='naive')),
            weights=dict(a=np.int64(1), b=np.float32(0.5)),
        )
    )
    assert mix.weights == {'a': 2 / 3, 'b': 1 / 3}
    with pytest.raises(ValueError, match="'replay_buffer_size' has invalid value 0"):
        create_buffer(dict(type='naive', replay_buffer_size=np.int64(0)))
    with pytest.raises(ValueError, match="'deepcopy' has value 1"):
        create_buffer(dict(type='naive', deepcopy=np.int64(1)))
    # in a tuple (which a config takes for a list) too: its max_use of 2 was 'invalid'
    removers = (dict(type='max_use', max_use=np.int64(2)),)
    buf = create_buffer(dict(type='naive', removers=removers))
    buf.push([{'obs': i} for i in range(2)])
    buf.sample(2), buf.sample(2)
    assert buf.count() == 0  # every item used twice: removed


def test_a_config_key_that_is_not_a_string_is_refused_naming_it():
    """A YAML ``1:`` (an int key), at the top or in a section: EasyDict failed on it with a TypeError naming
    nothing."""
    for cfg, name in (
        ({'type': 'naive', 1: 2}, "config key '1' "),
        ({'type': 'naive', 'storage': {'type': 'tensor', 2.5: 1}}, "config key 'storage.2.5' "),
        ({'type': 'mixture', 'members': {1: {'type': 'naive'}}}, "config key 'members.1' "),
        ({'type': 'naive', 'removers': [{'type': 'max_use', 1: 2}]}, "config key 'removers[0].1' "),
    ):
        with pytest.raises(ValueError, match=re.escape(name) + 'is of type'):
            create_buffer(cfg)


HUGE = 10**400  # an int no float holds


@pytest.mark.parametrize(
    'cfg, key',
    [
        (dict(type='naive', periodic_thruput_seconds=float('inf')), 'periodic_thruput_seconds'),
        (dict(type='naive', periodic_thruput_seconds=1e10), 'periodic_thruput_seconds'),
        (dict(type='episode', max_transitions=8, periodic_thruput_seconds=HUGE), 'periodic_thruput_seconds'),
        (dict(type='advanced', monitor=dict(periodic_thruput=dict(seconds=float('inf')))), 'monitor.periodic_thruput'),
        (dict(type='advanced', anneal_step=HUGE), 'anneal_step'),
        (dict(type='deque', priority=True, IS_weight_anneal_train_iter=HUGE), 'IS_weight_anneal_train_iter'),
        (dict(type='deque', priority=True, priority_max_limit=HUGE), 'priority_max_limit'),
        (dict(type='prioritized_episode', max_transitions=8, sampler=dict(type='prioritized', eps=HUGE)), 'eps'),
        (dict(type='prioritized_episode', max_transitions=8, sampler=dict(anneal_step=HUGE)), 'anneal_step'),
        (dict(type='naive', distributed=dict(timeout=HUGE)), 'distributed.timeout'),
        (dict(type='naive', distributed=dict(max_message_mb=HUGE)), 'distributed.max_message_mb'),
        (
            dict(type='mixture', members=dict(a=dict(type='naive'), b=dict(type='naive')), weights=dict(a=HUGE, b=1)),
            'a',
        ),
    ],
)
def test_numbers_no_float_holds_or_no_timer_can_wait_are_refused_naming_the_key(cfg, key):
    """Accepted, then a bare OverflowError at the build (10**400 in float math), at every update (a deque's clip) or
    in the throughput monitor's thread, which died (inf or 1e10 seconds overflow a timer)."""
    with pytest.raises(ValueError, match=re.escape(key)):
        create_buffer(cfg)


def test_a_sample_timeout_no_float_holds_is_refused():
    buf = create_buffer(dict(type='naive'))
    buf.push({'obs': 1})
    with pytest.raises(ValueError, match='timeout must be None or a number of seconds'):
        buf.sample(1, timeout=HUGE)


def test_a_training_config_with_a_key_that_is_not_a_string_is_refused_naming_it():
    from ding_buffer.train.config import build_train_config

    with pytest.raises(ValueError, match=re.escape("cfg.py: config key 'policy.other.replay_buffer.1' is of type int")):
        build_train_config({'policy': {'other': {'replay_buffer': {'type': 'advanced', 1: 2}}}}, 'cfg.py')


def test_a_dataset_section_takes_numpy_numbers(tmp_path):
    from ding_buffer.datasets import write_d4rl

    path = str(tmp_path / 'd.hdf5')
    rng = np.random.default_rng(0)
    terminals = np.zeros(20, bool)
    terminals[9] = True
    arrays = dict(observations=rng.standard_normal((20, 3)).astype(np.float32), actions=np.zeros((20, 1), np.float32))
    write_d4rl(path, dict(arrays, rewards=np.ones(20, np.float32), terminals=terminals))
    dataset = dict(path=path, chunk_size=np.int64(5), limit=np.int64(12), atomic=np.True_)
    buf = create_buffer(dict(type='naive', storage=dict(type='tensor'), dataset=dataset))
    assert buf.count() == 12


@pytest.mark.slow
def test_first_uses_in_several_threads_all_find_the_buffer_types():
    """The built-in types load at the first use; a second thread's first use meanwhile looked in the empty registry
    ('unknown buffer type') instead of waiting for the load. Fresh interpreters: the load happens once a process."""
    code = textwrap.dedent(
        """
        import threading
        import ding_buffer
        from ding_buffer.base import create_buffer
        barrier, errors = threading.Barrier(4), []
        def make():
            barrier.wait()
            try:
                create_buffer({'type': 'naive', 'replay_buffer_size': 10}).close()
            except Exception as e:
                errors.append(repr(e))
        threads = [threading.Thread(target=make) for _ in range(4)]
        [t.start() for t in threads]
        [t.join(60) for t in threads]
        print(errors)
        """
    )
    for _ in range(3):
        proc = subprocess.run(
            [sys.executable, '-c', code], capture_output=True, text=True, timeout=120, env=subprocess_env()
        )
        assert proc.returncode == 0 and proc.stdout.strip() == '[]', (proc.stdout, proc.stderr[-2000:])
