"""A malformed file, or a buffer that refuses the data midway, is one ValueError naming the file and the key, and
the buffer's state_dict() is what it was before the load."""

import sys

import numpy as np
import pytest
import torch
from dataset_files import d4rl_arrays, dingengine_arrays, dingengine_transitions, minari_file, pickle_file, write_h5
from helpers import assert_same

from ding_buffer import create_buffer
from ding_buffer.datasets import load_dataset


@pytest.fixture(params=['list', 'tensor'])
def buffer(request):
    """A buffer holding two transitions of the D4RL fields already (so 'unchanged' means something)."""
    buf = create_buffer(dict(type='naive', replay_buffer_size=100, storage=dict(type=request.param)))
    arrays = d4rl_arrays(np.random.default_rng(0), ends=(('t', 2),))
    buf.extend(
        {
            'obs': torch.from_numpy(arrays['observations']),
            'action': torch.from_numpy(arrays['actions']),
            'reward': torch.from_numpy(arrays['rewards']),
            'next_obs': torch.from_numpy(arrays['next_observations']),
            'done': torch.from_numpy(arrays['terminals']),
            'timeout': torch.from_numpy(arrays['timeouts']),
        }
    ) if request.param == 'tensor' else buf.push([{'obs': 1}, {'obs': 2}])
    yield buf
    buf.close()


def refused(buffer, path, match, **options):
    """Loading raises ValueError matching ``match`` and naming the file; the state is unchanged."""
    before = buffer.state_dict()
    with pytest.raises(ValueError, match=match) as info:
        load_dataset(buffer, path, progress=False, **options)
    assert str(path) in str(info.value), info.value
    assert_same(buffer.state_dict(), before)
    return str(info.value)


def d4rl(tmp_path, **changes):
    arrays = d4rl_arrays(np.random.default_rng(1))
    for key, value in changes.items():
        if value is None:
            del arrays[key]
        else:
            arrays[key] = value
    return write_h5(tmp_path / 'bad.hdf5', arrays)


def test_missing_key(tmp_path, buffer):
    refused(buffer, d4rl(tmp_path, rewards=None), r"key 'rewards' is missing", format='d4rl')


def test_ragged_lengths(tmp_path, buffer):
    refused(buffer, d4rl(tmp_path, actions=np.zeros((10, 2), np.float32)), r"key 'actions' has 10 rows, expected 11")


def test_wrong_dtype(tmp_path, buffer):
    refused(buffer, d4rl(tmp_path, rewards=np.array([b'x'] * 11)), r"key 'rewards' has dtype \|S1, expected numbers")


def test_flags_that_are_not_bools(tmp_path, buffer):
    terminals = np.zeros(11)
    terminals[4] = 0.5
    refused(buffer, d4rl(tmp_path, terminals=terminals), r"key 'terminals' holds 0.5 at row 4, expected bools")


def test_next_observations_of_another_shape(tmp_path, buffer):
    bad = np.zeros((11, 4), np.float32)
    refused(buffer, d4rl(tmp_path, next_observations=bad), r"key 'next_observations' has rows of shape \(4,\)")


def big_d4rl(tmp_path, name='big.hdf5'):
    arrays = d4rl_arrays(np.random.default_rng(2), ends=(('t', 3000), (None, 1000)), obs_shape=(16,))
    return write_h5(tmp_path / name, arrays)


def test_truncated_file(tmp_path, buffer):
    path = big_d4rl(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    refused(buffer, path, r'truncated', format='d4rl')


@pytest.mark.parametrize('offset', [0, 5, 9, 44])
def test_bit_flipped_header(tmp_path, buffer, offset):
    path = big_d4rl(tmp_path)
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))
    damaged = r'is not a readable HDF5 file|is neither an HDF5 file nor a pickle|cannot be read|fits no known layout'
    refused(buffer, path, damaged)


def test_not_hdf5(tmp_path, buffer):
    path = tmp_path / 'notes.txt'
    path.write_text('observations, actions\n1, 2\n')
    refused(buffer, path, r'is not a readable HDF5 file \(d4rl layout expected', format='d4rl')
    refused(buffer, path, r'is neither an HDF5 file nor a pickle')


def test_hdf5_of_no_known_layout(tmp_path, buffer):
    path = write_h5(tmp_path / 'other.hdf5', {'x': np.zeros(3)})
    refused(buffer, path, r'fits no known layout; pass format=')


def test_pickle_without_allow_pickle(tmp_path, buffer):
    path = pickle_file(tmp_path / 'expert.pkl', dingengine_transitions(np.random.default_rng(3)))
    refused(buffer, path, r'is a pickle .*allow_pickle=True')
    refused(buffer, path, r'allow_pickle=True', format='dingengine_pkl')


def test_pickle_of_transitions_with_other_keys(tmp_path, buffer):
    items = dingengine_transitions(np.random.default_rng(4))
    del items[3]['next_obs']
    path = pickle_file(tmp_path / 'expert.pkl', items)
    refused(buffer, path, r"key 'next_obs' is missing from transition 3", allow_pickle=True)


@pytest.mark.parametrize('done', [2, 'no', float('nan'), None, [True, False], torch.tensor([1, 0])])
def test_pickle_with_a_done_flag_that_is_not_one_bool(tmp_path, buffer, done):
    items = dingengine_transitions(np.random.default_rng(4))
    items[2]['done'] = done
    path = pickle_file(tmp_path / 'expert.pkl', items)
    refused(buffer, path, r"key 'done' of transition 2 is .*, expected one bool or 0 / 1", allow_pickle=True)


def test_pickle_done_flags_may_be_numpy_or_torch_bools_and_zero_one_numbers(tmp_path):
    buffer = create_buffer(dict(type='episode'))
    items = dingengine_transitions(np.random.default_rng(4), dones=())
    for i, done in enumerate([np.bool_(True), torch.tensor(True), 1, 0.0, np.int64(1), torch.tensor([0])]):
        items[i]['done'] = done
    path = pickle_file(tmp_path / 'expert.pkl', items)
    load_dataset(buffer, path, progress=False, allow_pickle=True)
    assert sorted(len(e) for e in buffer.sample(5)) == [1, 1, 1, 2, 2]  # ends after steps 0, 1, 2, 4 and 6 (last)


def test_damaged_pickle(tmp_path, buffer):
    path = pickle_file(tmp_path / 'expert.pkl', dingengine_transitions(np.random.default_rng(5)))
    path.write_bytes(path.read_bytes()[:-40])
    refused(buffer, path, r'is not a readable pickle', allow_pickle=True)


def test_minari_observations_without_the_extra_row(tmp_path, buffer):
    path = tmp_path / 'main_data.hdf5'
    minari_file(path, np.random.default_rng(6), nested=False)
    import h5py

    with h5py.File(path, 'a') as f:
        obs = f['episode_1/observations'][:-1]
        del f['episode_1/observations']
        f['episode_1/observations'] = obs
    refused(buffer, path, r"key 'episode_1/observations' has 5 rows, expected 6 rows")


@pytest.mark.parametrize('key', ['rewards', 'terminations', 'actions'])
def test_minari_a_step_column_of_another_length_is_the_one_named(tmp_path, buffer, key):
    path = tmp_path / 'main_data.hdf5'
    minari_file(path, np.random.default_rng(6), nested=False)
    import h5py

    with h5py.File(path, 'a') as f:  # episode_1 has 5 steps: one column cut to 3
        short = f[f'episode_1/{key}'][:3]
        del f[f'episode_1/{key}']
        f[f'episode_1/{key}'] = short
    refused(buffer, path, rf"key 'episode_1/{key}' has 3 rows, expected 5 rows")


def test_minari_episodes_of_different_shapes(tmp_path, buffer):
    path = tmp_path / 'main_data.hdf5'
    minari_file(path, np.random.default_rng(7))
    import h5py

    with h5py.File(path, 'a') as f:
        del f['episode_10/observations/pos']
        f['episode_10/observations/pos'] = np.zeros((3, 5), np.float32)
    refused(buffer, path, r"key 'episode_10/observations/pos' is rows of shape \(5,\) .*expected rows of shape \(2,\)")


@pytest.mark.parametrize('rewards', ['rows of shape (1,)', 'float32'])
def test_minari_episodes_whose_rewards_differ(tmp_path, buffer, rewards):
    """Rewards of another per-step shape failed after the check, blaming the buffer; of another dtype, they were
    upcast silently (or refused, depending on chunk_size). Both are refused up front, naming the episode."""
    path = tmp_path / 'main_data.hdf5'
    minari_file(path, np.random.default_rng(7))
    import h5py

    with h5py.File(path, 'a') as f:
        r = f['episode_1/rewards'][()]
        del f['episode_1/rewards']
        f['episode_1/rewards'] = r[:, None] if rewards != 'float32' else r.astype(np.float32)
    refused(buffer, path, r"key 'episode_1/rewards' is rows of shape .* expected rows of shape \(\) and dtype float64")


def _rows_of(path, width):
    """A D4RL file of 4 steps whose observations declare ``width`` floats a row (chunked: nothing stored)."""
    import h5py

    with h5py.File(path, 'w') as f:
        f.create_dataset('observations', shape=(4, width), dtype='f4', chunks=(1, min(width, 2**20)))
        f['actions'] = np.zeros((4, 2), np.float32)
        f['rewards'] = np.zeros(4, np.float32)
        f['terminals'] = np.zeros(4, bool)
    return path


def test_a_row_the_file_declares_beyond_memory_is_refused_naming_it(tmp_path, buffer):
    """A 4 KB file whose observations declare 2**36 floats a row raised a bare MemoryError naming neither the file
    nor the key."""
    path = _rows_of(tmp_path / 'lying.hdf5', 2**36)
    refused(
        buffer, path, r"key 'observations' declares rows of shape \(68719476736,\), too large to read", chunk_size=1
    )


def test_rows_beyond_memory_are_refused_before_the_read_where_memory_is_overcommitted(tmp_path, buffer, monkeypatch):
    """A system that overcommits memory grants the read of rows larger than the machine (no MemoryError): the
    process was killed as h5py filled them. The declared size is checked against the machine's memory first (here
    a machine of 1 MiB, rows of 2 MiB)."""
    from ding_buffer.datasets import hdf5

    monkeypatch.setattr(hdf5, 'machine_memory', lambda: 1 << 20)
    path = _rows_of(tmp_path / 'big_rows.hdf5', 2**19)
    refused(buffer, path, r"key 'observations' declares rows of shape \(524288,\), too large to read", chunk_size=1)


def test_dingengine_hdf5_missing_next_obs(tmp_path, buffer):
    arrays = dingengine_arrays(np.random.default_rng(8))
    del arrays['next_obs']
    path = write_h5(tmp_path / 'expert_demos.hdf5', arrays)
    refused(buffer, path, r"key 'next_obs' is missing", format='dingengine_hdf5')


@pytest.mark.parametrize('link', ['soft', 'external'])
def test_dingengine_hdf5_field_that_links_to_nothing(tmp_path, buffer, link):
    import h5py

    path = write_h5(tmp_path / 'expert_demos.hdf5', dingengine_arrays(np.random.default_rng(8)))
    with h5py.File(path, 'a') as f:
        f['extra'] = h5py.SoftLink('/nowhere') if link == 'soft' else h5py.ExternalLink('missing.hdf5', 'x')
    refused(buffer, path, r"key 'extra' is a link to nothing", format='dingengine_hdf5')


def test_dingengine_hdf5_group_where_a_field_is_expected(tmp_path, buffer):
    arrays = dingengine_arrays(np.random.default_rng(8))
    arrays['collect_iter'] = {'inner': np.arange(9)}
    path = write_h5(tmp_path / 'expert_demos.hdf5', arrays)
    refused(buffer, path, r"key 'collect_iter' is a group, expected a dataset", format='dingengine_hdf5')


def test_minari_episode_that_is_a_dataset_not_a_group(tmp_path, buffer):
    path = tmp_path / 'main_data.hdf5'
    minari_file(path, np.random.default_rng(7))
    import h5py

    with h5py.File(path, 'a') as f:
        f['episode_11'] = np.zeros(3, np.float32)
    refused(buffer, path, r"key 'episode_11' is a dataset, expected a group of datasets")


def test_buffer_refusing_midway_is_restored(tmp_path):
    """Episodes of 3 and 8 steps into an episode buffer of at most 5 transitions: the first is stored, the second
    refused; the buffer is restored."""
    arrays = d4rl_arrays(np.random.default_rng(9), ends=(('t', 3), ('t', 8)))
    path = write_h5(tmp_path / 'long.hdf5', arrays)
    buffer = create_buffer(dict(type='episode', replay_buffer_size=10, max_transitions=5, storage=dict(type='tensor')))
    small = d4rl_arrays(np.random.default_rng(19), ends=(('t', 2),))
    assert load_dataset(buffer, write_h5(tmp_path / 'small.hdf5', small), progress=False) == 1
    message = refused(buffer, path, r"buffer type 'episode' refused the transitions from 3 on", chunk_size=3)
    assert 'as it was before the load' in message


def test_tensor_buffer_refusing_a_changed_schema_midway_is_restored(tmp_path):
    items = dingengine_transitions(np.random.default_rng(10), n=9)
    items[7]['obs'] = torch.zeros(5)  # another shape, in the third chunk
    path = pickle_file(tmp_path / 'expert.pkl', items)
    buffer = create_buffer(dict(type='advanced', replay_buffer_size=100, storage=dict(type='tensor')))
    message = refused(buffer, path, r"refused the transitions from 6 on", allow_pickle=True, chunk_size=3)
    assert "'obs'" in message, message


def test_a_rate_limiter_refusing_is_a_refusal(tmp_path):
    path = write_h5(tmp_path / 'd.hdf5', d4rl_arrays(np.random.default_rng(11)))
    buffer = create_buffer(
        dict(type='naive', replay_buffer_size=100, thruput_controller=dict(push_sample_rate_limit=dict(max=1)))
    )
    buffer.push({'x': 1})
    buffer.sample(1)  # pushed / sampled is 1: the next push is refused
    refused(buffer, path, r'took 0 of 4 items', chunk_size=4)


@pytest.mark.parametrize('kind', ['gfn', 'chunk'])
def test_other_item_kinds_are_refused_by_name(tmp_path, kind):
    path = write_h5(tmp_path / 'd.hdf5', d4rl_arrays(np.random.default_rng(12)))
    buffer = create_buffer(dict(type=kind))
    with pytest.raises(ValueError, match=rf"buffer type '{kind}' stores items of kind"):
        load_dataset(buffer, path)
    buffer.close()


def test_frames_need_stacks(tmp_path):
    path = write_h5(tmp_path / 'flat.hdf5', d4rl_arrays(np.random.default_rng(13)))
    buffer = create_buffer(dict(type='naive', storage=dict(type='tensor', frames=dict())))
    before = buffer.state_dict()
    with pytest.raises(ValueError, match=r"per-step shape \(3,\) are not frame stacks \[stack, \*frame\]"):
        load_dataset(buffer, path)
    assert_same(buffer.state_dict(), before)


def test_bad_options_and_a_missing_file(tmp_path, buffer):
    path = write_h5(tmp_path / 'd.hdf5', d4rl_arrays(np.random.default_rng(14)))
    for options, match in (
        (dict(format='hdf5'), r"format 'hdf5' is not a dataset layout"),
        (dict(chunk_size=0), r'chunk_size 0 must be a positive int'),
        (dict(limit=-1), r'limit -1 must be None or an int'),
        (dict(allow_pickle='yes'), r"allow_pickle 'yes' must be a bool"),
    ):
        with pytest.raises(ValueError, match=match):
            load_dataset(buffer, path, **options)
    with pytest.raises(FileNotFoundError, match='no dataset file at'):
        load_dataset(buffer, tmp_path / 'nowhere.hdf5')
    with pytest.raises(FileNotFoundError, match=r"no dataset file at '.*': it is a directory \(give the file in it\)"):
        load_dataset(buffer, tmp_path)  # (e.g. a Minari dataset's folder, not its main_data.hdf5)


def test_without_h5py_the_error_says_what_to_install(tmp_path, buffer, monkeypatch):
    path = write_h5(tmp_path / 'd.hdf5', d4rl_arrays(np.random.default_rng(15)))
    monkeypatch.setitem(sys.modules, 'h5py', None)
    with pytest.raises(ImportError, match=r'pip install "ding_buffer\[datasets\]"'):
        load_dataset(buffer, path)


def test_a_mixture_is_refused_naming_its_members_and_one_member_fills(tmp_path):
    """A mixture holds several buffers: the file is for one of them, which the user names (it filled ``push_to``,
    the online member, silently)."""
    path = write_h5(tmp_path / 'd.hdf5', d4rl_arrays(np.random.default_rng(3), ends=(('t', 4),)))
    mix = create_buffer(
        dict(
            type='mixture',
            members=dict(
                offline=dict(type='naive', storage=dict(type='tensor')),
                online=dict(type='naive', storage=dict(type='tensor')),
            ),
        )
    )
    before = mix.state_dict()
    with pytest.raises(ValueError, match=r"holds the member buffers \['offline', 'online'\]; fill one of them"):
        load_dataset(mix, path, progress=False)
    assert_same(mix.state_dict(), before)
    assert load_dataset(mix.members['offline'], path, progress=False) == 4
    assert mix.members['offline'].count() == 4 and mix.members['online'].count() == 0


def test_a_header_declaring_another_shape_over_the_same_bytes_is_refused(tmp_path, buffer):
    """One damaged dimension in a dataset's header (rows of 2 values over the bytes of rows of 3): h5py would read
    the rows from the stored bytes as another layout; the declared size is checked against the stored one."""
    import struct

    arrays = d4rl_arrays(np.random.default_rng(1))
    del arrays['next_observations']
    path = write_h5(tmp_path / 'dims.hdf5', arrays)
    rows = len(arrays['observations'])
    data = path.read_bytes()
    dims = struct.pack('<QQ', rows, 3)  # observations' dimensions (and maximum dimensions) in its header
    assert data.count(dims) >= 1
    path.write_bytes(data.replace(dims, struct.pack('<QQ', rows, 2)))
    refused(
        buffer, path, r"key 'observations' declares \(11, 2\) float32 \(88 bytes\) over 132 stored bytes", format='d4rl'
    )


def test_member_names_that_are_not_text_are_other_keys_or_refused_by_name(tmp_path, buffer):
    """h5py gives a name that is not UTF-8 text as bytes: an extra such key is one more key not read (the layout is
    still told); where every key is read (DI-engine's layout) it is refused naming it, as a ValueError."""
    import h5py

    arrays = d4rl_arrays(np.random.default_rng(1))
    path = write_h5(tmp_path / 'names.hdf5', arrays)
    with h5py.File(path, 'a') as f:
        f.create_dataset(b'r\xe9sum\xe9', data=np.zeros(3))
    before = buffer.count()
    assert load_dataset(buffer, path, progress=False) == len(arrays['observations']) and buffer.count() > before
    path = write_h5(tmp_path / 'dingengine.hdf5', dingengine_arrays(np.random.default_rng(2)))
    with h5py.File(path, 'a') as f:
        f.create_dataset(b'r\xe9sum\xe9', data=np.zeros(3))
    refused(buffer, path, r"has a member named b'r\\xe9sum\\xe9', which is not UTF-8 text", format='dingengine_hdf5')


def test_a_closed_buffer_is_refused_as_closed_not_as_a_damaged_file(tmp_path):
    buf = create_buffer(dict(type='naive', storage=dict(type='tensor')))
    buf.close()
    path = d4rl(tmp_path)
    for atomic in (True, False):
        with pytest.raises(RuntimeError, match="is closed"):
            load_dataset(buf, path, progress=False, atomic=atomic)


@pytest.mark.parametrize('storage', ['list', 'tensor'])
def test_an_episode_larger_than_memory_is_refused_naming_the_file_before_it_is_held_whole(
    tmp_path, monkeypatch, storage
):
    """An episode buffer holds an episode's chunks until its end flag; a file whose episode never ends (a few KB
    declaring 10**5 steps of big rows) grew that unchecked until the machine ran out (here: a machine of 256 KiB,
    an episode of 400 KiB), and the error then blamed the buffer, naming no file."""
    from ding_buffer.datasets import feed

    monkeypatch.setattr(feed, 'machine_memory', lambda: 1 << 18, raising=False)
    arrays = dict(
        observations=np.zeros((100, 2**10), np.float32),  # 4 KiB a step, 400 KiB in all: no end flag
        actions=np.zeros((100, 2), np.float32),
        rewards=np.zeros(100, np.float32),
        terminals=np.zeros(100, bool),
    )
    path = write_h5(tmp_path / 'one_long_episode.hdf5', arrays)
    buf = create_buffer(dict(type='episode', max_transitions=1000, storage=dict(type=storage)))
    refused(buf, path, r'holds an episode of more than \d+ steps', chunk_size=10)
