"""Declared capabilities (``IBuffer.capabilities``): what the manager and the training jobs read instead of
probing class hierarchies. The declarations are checked against what each type really does, so they cannot
drift from the code."""

import inspect

import pytest
import torch
from easydict import EasyDict
from helpers import assert_same

from ding_buffer import BUFFER_REGISTRY, IBuffer
from ding_buffer.distributed import build_manager_buffer
from ding_buffer.distributed.manager import ManagerCore
from ding_buffer.train.config import build_train_config

TYPES = sorted(BUFFER_REGISTRY.keys())
SIZE_ARGS = {'self', 'size', 'batch', 'sequence', 'timeout'}


def test_every_registered_type_declares_its_capabilities():
    kinds = {name: BUFFER_REGISTRY.get(name).capabilities()['item_kind'] for name in TYPES}
    assert kinds == {
        'advanced': 'transition',
        'chunk': 'chunk',
        'deque': 'transition',
        'elastic': 'transition',
        'episode': 'episode',
        'gfn': 'trajectory',
        'gfn_diverse': 'trajectory',
        'mixture': 'transition',
        'naive': 'transition',
        'prioritized_episode': 'episode',
        'sequence': 'sequence',
        'terminating_state': 'state',
    }


@pytest.mark.parametrize('name', TYPES)
def test_declared_sample_kwargs_are_the_sample_signature(name):
    """What a type declares its ``sample`` takes is exactly what its signature takes (a ``**kwargs`` signature,
    which refuses everything it gets, takes what is named)."""
    cls = BUFFER_REGISTRY.get(name)
    params = inspect.signature(cls.sample).parameters
    named = [p for p in params if p not in SIZE_ARGS and params[p].kind is not inspect.Parameter.VAR_KEYWORD]
    assert list(cls.capabilities()['sample_kwargs']) == named


@pytest.mark.parametrize('name', TYPES)
def test_declared_methods_exist_exactly_where_declared(name):
    cls = BUFFER_REGISTRY.get(name)
    caps = cls.capabilities()
    assert caps['has_log_rewards'] == callable(getattr(cls, 'log_rewards', None))
    assert caps['version_gate'] == callable(getattr(cls, 'update_model_version', None))
    profile = cls.distributed_profile(cls.default_config())  # what the manager and its workers read
    assert {k: profile[k] for k in caps} == caps


def test_a_users_type_declares_by_class_attributes():
    class Windows(IBuffer):  # what a user's own type writes; the abstract methods are not needed to declare
        item_kind = 'sequence'
        sample_kwargs = ('cur_learner_iter', 'window')

    assert Windows.capabilities() == {
        'item_kind': 'sequence',
        'sample_kwargs': ('cur_learner_iter', 'window'),
        'has_log_rewards': False,
        'version_gate': False,
    }


def _core(cfg):
    buf, dcfg, key = build_manager_buffer(EasyDict(cfg))
    return ManagerCore(buf, dcfg, key)


def _sample(core, size, **kwargs):
    return core.handle('w0', {'op': 'sample', 'id': 1, 'shard': 0, 'args': {'size': size, 'kwargs': kwargs}})


def test_manager_refuses_a_sample_argument_the_buffer_type_does_not_take_by_name():
    core = _core(dict(type='naive', replay_buffer_size=8, seed=0, distributed=dict(backend='torch')))
    core.buffer.push([{'x': torch.tensor([float(i)])} for i in range(4)])
    before = core.buffer.state_dict()
    reply = _sample(core, 2, unroll_len=2)  # an episode buffer's argument, refused before the buffer sees it
    assert not reply['ok'] and reply['error'] == 'ValueError'
    assert "['unroll_len']" in reply['message'] and 'NaiveReplayBuffer' in reply['message']
    assert "'replace'" in reply['message']  # what it does take
    assert_same(core.buffer.state_dict(), before)
    assert _sample(core, 2, replace=True)['ok']


def test_trainers_accept_the_declared_transition_types_and_refuse_the_others():
    def build(buffer_type):
        return build_train_config(
            dict(
                policy=dict(
                    learn=dict(batch_size=4),
                    other=dict(replay_buffer=dict(type=buffer_type, replay_buffer_size=64)),
                )
            )
        )

    for ok_type in ('naive', 'advanced', 'elastic'):
        assert build(ok_type).policy.other.replay_buffer.type == ok_type
    for refused in ('sequence', 'deque', 'episode', 'chunk'):
        with pytest.raises(ValueError, match=f"'{refused}'.*DQN trainer cannot use"):
            build(refused)
