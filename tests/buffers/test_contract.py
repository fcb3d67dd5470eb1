"""Contract tests of every registered buffer type x storage combination, through the public API only
(push / sample / update / state_dict / load_state_dict / save_data / load_data / close).

Combinations (test ids; ``helpers.Case`` configures, feeds and samples each): ``naive``, ``advanced``,
``episode``, ``sequence`` and ``deque`` on ``list``, ``tensor`` and ``memmap`` (tensor storage with
``memmap_dir``) storage; ``deque_prio`` (the deque with ``priority=True``) and ``elastic`` on ``list`` and
``tensor``; ``prioritized_episode`` on ``tensor`` and ``memmap`` (its windows need flat tensor storage);
``gfn``, ``gfn_diverse`` and ``terminating_state`` (dict batches of ``state`` [B, d] and ``log_reward`` [B]; no
storage section); ``chunk`` with its payload store in ``memory`` or on ``disk`` (an item is one chunk of two
fragments of one worker; a sample of n items is n chunks).

Contracts:
1. push is all or nothing: a batch with one invalid item raises and leaves ``state_dict()`` unchanged; a
   batched push keeps no reference to the caller's batch;
2. update is all or nothing where it takes priorities (``advanced``, ``prioritized_episode``, ``deque_prio``:
   garbage raises, state unchanged); elsewhere a well-formed update is a no-op;
3. load is all or nothing: a corrupted state for ``load_state_dict``, a truncated / damaged file for ``load_data``
   raise ``ValueError``/``TypeError`` and leave the buffer unchanged;
4. save -> load gives a buffer whose next samples (and RNG) are identical;
5. (prioritized types) updates of replaced items are counted as stale and applied to nothing;
6. ``close()`` is idempotent, keeps the data, and a closed buffer refuses pushes; it joins every helper thread
   (skipped, with the reason, for the deque and the chunk buffer, which start none);
7. concurrent push / sample (/ update) keep the buffer consistent (its state round-trips).

Known bugs are ``xfail(strict=True)`` with the reason; fixing one turns its test into an XPASS failure: remove the
mark then.
"""

import copy
import io
import re
import threading
import time
import zipfile

import numpy as np
import pytest
import torch
from helpers import OBS_DIM, Case, Payload, assert_same, run_threads, states_equal, wait_until

from ding_buffer import create_buffer

NAN = float('nan')
STRESS_SECONDS = 0.8


def refused(exc, label, match=None):
    """Like ``pytest.raises(exc, match=match)``, but a failure names the case (``label``)."""
    return _Refused(exc, label, match)


class _Refused:
    def __init__(self, exc, label, match):
        self.exc, self.label, self.match = exc, label, match

    def __enter__(self):
        return self

    def __exit__(self, etype, value, tb):
        if etype is None:
            pytest.fail(f"{self.label}: did not raise {self.exc}")
        if not issubclass(etype, self.exc):
            raise AssertionError(  # noqa: TRY004 (a test failure, not a type error)
                f"{self.label}: raised {etype.__name__}: {value}, expected {self.exc}"
            ) from value
        if self.match is not None and not re.search(self.match, str(value)):
            raise AssertionError(f"{self.label}: the message {str(value)!r} does not match {self.match!r}") from value
        return True


# invalid only against the schema fixed by earlier pushes (a valid first push)
SCHEMA_ONLY = {'single item with a wrong obs shape'}


CASES = [Case(p, s) for p in ('naive', 'advanced') for s in ('list', 'tensor', 'memmap')]
CASES += [Case('episode', 'list', limit_list=True)] + [Case('episode', s) for s in ('tensor', 'memmap')]
CASES += [Case('elastic', s) for s in ('list', 'tensor')]  # the naive ring with a sampling window
CASES += [Case('prioritized_episode', s) for s in ('tensor', 'memmap')]  # windows need flat (tensor) storage
CASES += [Case(p) for p in ('gfn', 'gfn_diverse', 'terminating_state')]
CASES += [Case('sequence', s) for s in ('list', 'tensor', 'memmap')]  # the naive ring sampled as runs
CASES += [Case('deque', s) for s in ('list', 'tensor', 'memmap')]  # DI-engine's wrapper over naive ...
CASES += [Case('deque', s, variant='prio') for s in ('list', 'tensor')]  # ... and advanced (priority=True)
CASES += [Case('chunk', s) for s in ('memory', 'disk')]  # fragments in, chunks out; payloads in memory / on disk
PRIORITIZED = [c for c in CASES if c.prioritized]
UNPRIORITIZED = [c for c in CASES if not c.prioritized]

all_cases = pytest.mark.parametrize('case', CASES, ids=lambda c: c.id)


# ================================================================================ 1. push: all or nothing
@all_cases
def test_push_is_all_or_nothing(case, tmp_path):
    rng = np.random.default_rng(1)
    buf = case.make(tmp_path)
    invalid = case.invalid_pushes(rng)
    # on an empty buffer: no schema / store may be committed by a refused first push
    for label, args, kwargs, exc, *match in invalid:
        if label in SCHEMA_ONLY:
            continue  # a valid first push: it defines the schema
        before = buf.state_dict()
        with refused(exc, f'push ({label}) on an empty buffer', *match):
            buf.push(*args, **kwargs)
        assert_same(buf.state_dict(), before, f'state after refused push ({label}) on an empty buffer')
    assert buf.count() == 0
    case.fill(buf, rng, 6)
    assert buf.count() == 6
    case.sample(buf, 2)  # advances the RNG and (advanced) use counts: part of the compared state
    for label, args, kwargs, exc, *match in invalid:
        before = buf.state_dict()
        with refused(exc, f'push ({label})', *match):
            buf.push(*args, **kwargs)
        assert_same(buf.state_dict(), before, f'state after refused push ({label})')
    assert buf.count() == 6
    # the buffer still works, and a valid push does change the state
    before = buf.state_dict()
    case.fill(buf, rng, 2, start=6)
    assert buf.count() == 8
    assert not states_equal(buf.state_dict(), before)
    buf.close()


@pytest.mark.parametrize('case', [c for c in CASES if not (c.episodic or c.chunk)], ids=lambda c: c.id)
def test_a_batched_push_keeps_no_reference_to_the_callers_batch(case, tmp_path):
    """Collectors reuse their batch buffers, and the manager hands shared-memory rows to ``push`` in place: what a
    batched push stored never changes when the caller writes to its batch afterwards. (Episode buffers take whole
    episodes, the chunk buffer fragments: neither takes a batch.)"""
    rng = np.random.default_rng(2)
    buf = case.make(tmp_path)
    if case.gfn:
        batch = case.gfn_batch(rng, 4)
    else:
        batch = {'obs': torch.from_numpy(rng.standard_normal((4, OBS_DIM)).astype(np.float32)), 'act': torch.arange(4)}
    assert buf.push(batch, batched=True) == 4
    before = copy.deepcopy(buf.state_dict())  # (a state may share memory with the buffer)
    for v in batch.values():
        v.fill_(7)
    assert_same(buf.state_dict(), before, f'{case.id}: state after the caller rewrote its batch')
    buf.close()


# ================================================================================ 2. update: all or nothing
@pytest.mark.parametrize('case', [c for c in CASES if c.takes_garbage_updates], ids=lambda c: c.id)
def test_update_garbage_is_all_or_nothing(case, tmp_path):
    rng = np.random.default_rng(2)
    buf = case.make(tmp_path)
    case.fill(buf, rng, case.cap)
    batch = case.sample(buf, 6)
    good, answer = case.good_update(batch)
    for label, info, exc, *match in case.garbage_updates(good):
        before = buf.state_dict()
        with refused(exc, f'update ({label})', *match):
            buf.update(info)
        assert_same(buf.state_dict(), before, f'state after refused update ({label})')
    # the well-formed update is applied (so the comparisons above could have seen a partial one)
    before = buf.state_dict()
    assert buf.update(good) == answer
    assert not states_equal(case.without_counters(buf.state_dict()), case.without_counters(before))
    buf.close()


@pytest.mark.parametrize('case', UNPRIORITIZED, ids=lambda c: c.id)
def test_update_is_a_no_op_without_priorities(case, tmp_path):
    rng = np.random.default_rng(2)
    buf = case.make(tmp_path)
    case.fill(buf, rng, 8)
    assert case.sample(buf, 3) is not None
    before = buf.state_dict()
    info = {'replay_unique_id': [0, 1, 2], 'replay_buffer_idx': [0, 1, 2], 'priority': [0.5, 1.0, 2.0]}
    assert buf.update(info) == {'updated': 0, 'stale': 0}
    assert_same(buf.state_dict(), before, 'state after update')
    buf.close()


@all_cases
@pytest.mark.parametrize('size', [2**62, 2**31 + 1, np.int64(2**40)], ids=['2**62', '2**31+1', 'np.int64(2**40)'])
def test_a_sample_no_memory_could_hold_is_refused_naming_its_size(case, size, tmp_path):
    """Drawn with replacement a size may exceed the stored count, but not every bound: a size beyond 2**31 is
    refused by name, before the draw allocates anything, and the buffer is unchanged."""
    rng = np.random.default_rng(3)
    buf = case.make(tmp_path)
    case.fill(buf, rng, 6)
    before = buf.state_dict()
    with refused(ValueError, f'sample({size})', r'sample size must be at most 2\*\*31, got \d+'):
        case.sample(buf, size)
    assert_same(buf.state_dict(), before, 'state after a refused sample')
    assert case.sample(buf, 2) is not None
    buf.close()


@all_cases
def test_clear_counts_every_element_it_removes(case, tmp_path):
    """``remove_count`` counts what ``clear()`` removes, on every type, in the unit ``count()`` uses."""
    rng = np.random.default_rng(5)
    buf = case.make(tmp_path)
    case.fill(buf, rng, 6)
    n, before = buf.count(), buf.stats()['remove_count']
    assert n > 0
    buf.clear()
    assert buf.count() == 0
    assert buf.stats()['remove_count'] == before + n
    buf.close()


# ================================================================================ 3. load: all or nothing
@all_cases
@pytest.mark.parametrize('fill', ['wrapped', 'partly filled'])
def test_load_state_dict_corrupted_is_all_or_nothing(case, fill, tmp_path):
    """Every corruption of ``Case.corruptions`` of a source state -- one that wrapped around its ring, and one
    partly filled (empty slots) -- is refused with the buffer unchanged."""
    rng = np.random.default_rng(3)
    src = case.make(tmp_path, 'src')
    if fill == 'wrapped':
        case.exercise(src, rng)
    else:
        case.fill(src, rng, 5)
    state = src.state_dict()
    buf = case.make(tmp_path, 'dst')
    case.fill(buf, np.random.default_rng(4), 5)
    case.sample(buf, 2)
    for label, bad in case.corruptions(state):
        before = buf.state_dict()
        with refused((ValueError, TypeError), f'load_state_dict ({label})'):
            buf.load_state_dict(bad)
        assert_same(buf.state_dict(), before, f'state after refused load_state_dict ({label})')
    # the intact state loads (so the refusals above were about the corruption)
    buf.load_state_dict(state)
    assert_same(buf.state_dict(), state)
    src.close()
    buf.close()


DATA_KEYED = {'last_fid', 'queues', 'payloads'}  # dicts keyed by data (a chunk buffer's workers, fragment ids)


def _dict_paths(d, path=()):
    for k, v in d.items():
        yield path + (k,)
        if isinstance(v, dict) and k not in DATA_KEYED:
            yield from _dict_paths(v, path + (k,))


def _source_and_target(case, tmp_path):
    """A buffer that went through ``exercise``, its state, and another one partly filled, with its state."""
    src = case.make(tmp_path, 'src')
    case.exercise(src, np.random.default_rng(3))
    buf = case.make(tmp_path, 'dst')
    case.fill(buf, np.random.default_rng(4), 5)
    return src, buf, src.state_dict(), buf.state_dict()


@all_cases
def test_load_state_dict_with_a_renamed_key_is_refused_naming_it(case, tmp_path):
    """A damaged or edited key ('envstep' with one bit flipped) must not load as a state that lacks the entry, its
    value taken as the default: every key of every dict of a real state, renamed, is refused naming the key (or the
    entry holding it), with the buffer unchanged."""
    src, buf, state, before = _source_and_target(case, tmp_path)
    paths = [p for p in _dict_paths(state) if p != ('type',)]
    assert len(paths) > 5
    for path in paths:
        bad = copy.deepcopy(state)
        parent = bad
        for k in path[:-1]:
            parent = parent[k]
        new = f'{path[-1]}_'
        parent[new] = parent.pop(path[-1])
        named = '|'.join(re.escape(str(k)) for k in path)  # the key, or the entry holding it
        with pytest.raises(ValueError, match=f"{re.escape(repr(new))}|{named}"):
            buf.load_state_dict(bad)
        assert_same(buf.state_dict(), before, f'state after the refused load of {path} renamed')
    src.close()
    buf.close()


@all_cases
def test_load_state_dict_with_a_tensor_on_the_meta_device_is_refused_naming_it(case, tmp_path):
    """A tensor without values (``.to('meta')``, e.g. a state built under ``torch.device('meta')``) in any dict of a
    real state is refused naming its key, with the buffer unchanged (it failed in numpy naming no key)."""
    src, buf, state, before = _source_and_target(case, tmp_path)
    paths = []
    for path in _dict_paths(state):
        value = state
        for k in path:
            value = value[k]
        if isinstance(value, torch.Tensor):
            paths.append(path)
        elif isinstance(value, list) and path[-1] != 'items':  # a state's tensor columns (not the pushed items)
            paths += [path + (i,) for i, v in enumerate(value) if isinstance(v, torch.Tensor)]
    if not paths:
        pytest.skip('no tensor among the keyed entries of this state (its payloads are keyed by data)')
    for path in paths:
        bad = copy.deepcopy(state)
        parent = bad
        for k in path[:-1]:
            parent = parent[k]
        parent[path[-1]] = parent[path[-1]].to('meta')
        named = re.escape('state' + ''.join(f'[{k!r}]' for k in path))
        with pytest.raises(ValueError, match=f"{named} is a tensor on the meta device"):
            buf.load_state_dict(bad)
        assert_same(buf.state_dict(), before, f'state after the refused load of {path} on meta')
    src.close()
    buf.close()


# --------------------------------------------------------------------- GFlowNet states that are inconsistent
def _gfn_no_track_states(state):
    return {k: v for k, v in state.items() if k != 'track_states'}


def _gfn_nan_log_reward(state):
    index = dict(state['index'])
    r = index['log_reward'].clone()
    r[0] = NAN
    index['log_reward'] = r
    return dict(state, index=index)


def _gfn_store_none(state):
    return dict(state, store=None)


GFN_INCONSISTENT = [
    # without it the terminating-state set would be left empty (gfn_diverse would admit exact duplicates)
    pytest.param(_gfn_no_track_states, id='no-track_states'),
    # push refuses NaN rewards, so a load must too
    pytest.param(_gfn_nan_log_reward, id='nan-log_reward'),
    # an 'index' listing items with no store: refused, not loaded as an empty buffer
    pytest.param(_gfn_store_none, id='store-None-with-index'),
]


@pytest.mark.parametrize('corrupt', GFN_INCONSISTENT)
@pytest.mark.parametrize('case', [c for c in CASES if c.gfn], ids=lambda c: c.id)
def test_load_state_dict_inconsistent_gfn_state_is_refused_or_repaired(case, corrupt, tmp_path):
    """An inconsistent state is refused (buffer unchanged) or repaired (the buffer equals the intact source);
    it is never half-loaded."""
    src, buf, state, before = _source_and_target(case, tmp_path)
    try:
        buf.load_state_dict(corrupt(state))
    except (ValueError, TypeError):
        assert_same(buf.state_dict(), before, 'state after refused load_state_dict')
    else:
        assert_same(buf.state_dict(), state, 'state loaded from an inconsistent state (not refused)')


# --------------------------------------------------------------------- damaged files
def _saved(case, tmp_path):
    """(target buffer, its state, bytes of a file saved from another buffer)."""
    src = case.make(tmp_path, 'src')
    case.exercise(src, np.random.default_rng(5))
    path = tmp_path / 'src.pt'
    src.save_data(str(path))
    src.close()
    buf = case.make(tmp_path, 'dst')
    case.fill(buf, np.random.default_rng(6), 5)
    case.sample(buf, 2)
    return buf, buf.state_dict(), path.read_bytes()


def _check_refused_file(case, buf, before, raw, path, label, allow_pickle=None, match=None):
    if raw is not None:
        path.write_bytes(bytes(raw))
    allow_pickle = case.allow_pickle if allow_pickle is None else allow_pickle
    with refused(ValueError, f'load_data ({label}, allow_pickle={allow_pickle})', match):
        buf.load_data(str(path), allow_pickle=allow_pickle)
    assert_same(buf.state_dict(), before, f'state after refused load_data ({label})')


def _flip(raw, pos, bit=0):
    out = bytearray(raw)
    out[pos] ^= 1 << bit
    return out


@all_cases
def test_load_data_truncated_or_broken_file_is_all_or_nothing(case, tmp_path):
    buf, before, raw = _saved(case, tmp_path)
    path = tmp_path / 'damaged.pt'
    for cut in (0, 1, 22, len(raw) // 10, len(raw) // 2, len(raw) - 23, len(raw) - 1):
        _check_refused_file(case, buf, before, raw[:cut], path, f'truncated to {cut} of {len(raw)} bytes')
    _check_refused_file(case, buf, before, np.random.default_rng(0).bytes(len(raw)), path, 'random bytes')
    _check_refused_file(case, buf, before, _flip(raw, 0), path, 'flipped bit in the zip signature')
    eocd = raw.rfind(b'PK\x05\x06')
    assert eocd > 0
    _check_refused_file(case, buf, before, _flip(raw, eocd + 1), path, 'flipped bit in the end-of-directory record')
    for allow_pickle in (False, True):
        torch.save({'weights': torch.ones(3), 'step': 10}, str(path))
        _check_refused_file(case, buf, before, None, path, 'a file of something else', allow_pickle)
        future = {'format': 'ding_buffer', 'version': 999, 'buffer': before['type'], 'state': {}}
        torch.save(future, str(path))
        _check_refused_file(case, buf, before, None, path, 'a file of a future format version', allow_pickle)
    # the intact file loads (so the refusals above were about the damage)
    path.write_bytes(raw)
    buf.load_data(str(path), allow_pickle=case.allow_pickle)
    assert not states_equal(buf.state_dict(), before)


@all_cases
def test_load_data_bit_flip_in_envelope_raises_value_error(case, tmp_path):
    buf, before, raw = _saved(case, tmp_path)
    pos = raw.index(b'X\x05\x00\x00\x00state') + 5  # the pickled envelope key 'state' (BINUNICODE)
    _check_refused_file(case, buf, before, _flip(raw, pos), tmp_path / 'damaged.pt', "flipped bit in key 'state'")


def _central_entries(raw):
    """(member name, offset of its central-directory record) of every member of a zip file that holds data."""
    with zipfile.ZipFile(io.BytesIO(bytes(raw))) as z:
        infos, pos = z.infolist(), z.start_dir
    out = []
    for info in infos:
        assert raw[pos : pos + 4] == b'PK\x01\x02'
        if info.file_size:  # an empty member reads as empty whatever its flags say
            out.append((info.filename, pos))
        pos += 46 + sum(int.from_bytes(raw[pos + k : pos + k + 2], 'little') for k in (28, 30, 32))
    return out


@all_cases
def test_load_data_bit_flip_in_a_member_s_flags_or_method_raises_value_error(case, tmp_path):
    """A flipped bit that marks a member as encrypted (flag bit 0) or deflated (method 0 -> 8) in the central
    directory: zipfile raises RuntimeError / zlib.error on reading it, which is a damaged file like any other."""
    buf, before, raw = _saved(case, tmp_path)
    path = tmp_path / 'damaged.pt'
    for name, pos in _central_entries(raw):
        _check_refused_file(case, buf, before, _flip(raw, pos + 8), path, f'{name} flagged as encrypted')
        _check_refused_file(case, buf, before, _flip(raw, pos + 10, 3), path, f'{name} flagged as deflated')


@all_cases
def test_load_data_member_marked_as_a_directory_raises_value_error(case, tmp_path):
    """One flipped bit (0x10 of the external attributes in the central directory) marks a member as an MS-DOS
    directory: zipfile's CRC check still passes, but torch.load's reader then reads no data for it, so the loaded
    tensors held whatever memory was there. It is refused as a damaged file."""
    buf, before, raw = _saved(case, tmp_path)
    path = tmp_path / 'damaged.pt'
    for name, pos in _central_entries(raw):
        _check_refused_file(
            case, buf, before, _flip(raw, pos + 38, 4), path, f'{name} marked as a directory', match='directory'
        )


@all_cases
def test_load_data_refuses_compressed_members_before_inflating_them(case, tmp_path):
    """torch.save stores every member as it is: a file whose members are deflated (valid, CRC-32 intact) is foreign
    -- and one such member of a few KB may inflate to gigabytes -- so it is refused before anything is read."""
    buf, before, raw = _saved(case, tmp_path)
    packed = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(bytes(raw))) as z, zipfile.ZipFile(packed, 'w', zipfile.ZIP_DEFLATED) as out:
        for info in z.infolist():
            out.writestr(info.filename, z.read(info.filename))
    _check_refused_file(
        case, buf, before, packed.getvalue(), tmp_path / 'packed.pt', 'deflated members', match='is compressed'
    )


def _data_records(raw):
    """(name, first byte, size) of every tensor record ('.../data/N') of a torch.save zip file."""
    out = []
    with zipfile.ZipFile(io.BytesIO(bytes(raw))) as z:
        for info in z.infolist():
            if '/data/' in info.filename and info.file_size:
                h = info.header_offset
                name_len = int.from_bytes(raw[h + 26 : h + 28], 'little')
                extra_len = int.from_bytes(raw[h + 28 : h + 30], 'little')
                start = h + 30 + name_len + extra_len  # the local file header precedes the data
                out.append((info.filename, start, info.file_size))
    return out


@all_cases
def test_load_data_bit_flip_in_tensor_data_raises_value_error(case, tmp_path):
    buf, before, raw = _saved(case, tmp_path)
    records = _data_records(raw)
    assert records
    path = tmp_path / 'damaged.pt'
    accepted = []
    for name, start, size in records:
        path.write_bytes(bytes(_flip(raw, start + size // 2)))
        try:
            buf.load_data(str(path), allow_pickle=case.allow_pickle)
        except ValueError:
            assert_same(buf.state_dict(), before, f'state after refused load_data (flipped bit in {name})')
            continue
        accepted.append(name)
        buf.load_state_dict(before)
    if accepted:
        pytest.fail(
            f"load_data accepted {len(accepted)} of {len(records)} files with a flipped bit in a tensor "
            f"record: {accepted}"
        )


@all_cases
def test_load_of_a_buffer_configured_otherwise_is_all_or_nothing(case, tmp_path):
    """States and files of the same type configured otherwise (capacity, storage kind, transition limit) are
    refused, by load_state_dict and by load_data."""
    case.require('another configuration')
    buf = case.make(tmp_path, 'dst')
    case.fill(buf, np.random.default_rng(6), 5)
    case.sample(buf, 2)
    before = buf.state_dict()
    for k, (label, overrides) in enumerate(case.other_configs()):
        src = case.make(tmp_path, f'src{k}', **overrides)
        case.exercise(src, np.random.default_rng(5))
        state, path = src.state_dict(), tmp_path / f'src{k}.pt'
        src.save_data(str(path))
        src.close()
        with refused((ValueError, TypeError), f'load_state_dict (the state of a buffer with {label})'):
            buf.load_state_dict(state)
        assert_same(buf.state_dict(), before, f'state after refused load_state_dict ({label})')
        with refused(ValueError, f'load_data (the file of a buffer with {label})'):
            buf.load_data(str(path), allow_pickle=True)
        assert_same(buf.state_dict(), before, f'state after refused load_data ({label})')
    buf.close()


@all_cases
@pytest.mark.parametrize('obj', [Payload(7), np.zeros(2, dtype=np.float32)], ids=['object', 'numpy-array'])
def test_load_data_of_python_objects_needs_allow_pickle(case, obj, tmp_path):
    case.require('python objects')
    src = case.make(tmp_path, 'src')
    src.push(case.object_data(np.random.default_rng(11), obj))
    path = tmp_path / 'objects.pt'
    src.save_data(str(path))
    buf = case.make(tmp_path, 'dst')
    case.fill(buf, np.random.default_rng(6), 5)
    before = buf.state_dict()
    with refused(ValueError, 'load_data of Python objects without allow_pickle', 'allow_pickle'):
        buf.load_data(str(path))
    assert_same(buf.state_dict(), before, 'state after refused load_data')
    buf.load_data(str(path), allow_pickle=True)  # trusted: loads
    assert_same(buf.state_dict(), src.state_dict())
    src.close()
    buf.close()


# ================================================================================ 4. save -> load -> same samples
@pytest.mark.parametrize('case', CASES, ids=lambda c: c.id)
def test_save_load_gives_identical_next_samples(case, tmp_path):
    a = case.make(tmp_path, 'a')
    case.exercise(a, np.random.default_rng(7))
    path = tmp_path / 'saved' / 'buffer.pt'
    a.save_data(str(path))
    b = case.make(tmp_path, 'b')
    b.load_data(str(path), allow_pickle=case.allow_pickle)
    assert b.count() == a.count() > 0
    assert_same(b.state_dict(), a.state_dict())
    for second in (False, True):  # episode: whole episodes, then windows
        sa, sb = case.sample(a, 5, second), case.sample(b, 5, second)
        assert sa is not None
        assert_same(sb, sa, f'sample {int(second) + 1}')
    assert_same(b.state_dict(), a.state_dict())  # the RNGs advanced identically
    a.close()
    b.close()


# ================================================================================ 5. stale updates
@pytest.mark.parametrize('case', PRIORITIZED, ids=lambda c: c.id)
def test_updates_of_overwritten_items_are_stale(case, tmp_path):
    rng = np.random.default_rng(8)
    buf = case.make(tmp_path)
    log = []  # sizes of everything pushed, for the reference of what the buffer still holds
    pushed = case.fill(buf, rng, case.cap, log=log)
    old = case.sample(buf, 8)
    pushed = case.fill(buf, rng, case.cap, start=pushed, log=log)  # replaces every stored item / episode
    assert not set(case.numbers_of(old)) & case.stored_numbers(log)
    stats = buf.stats()
    before = case.without_counters(buf.state_dict())
    assert buf.update(case.update_info(old, [5.0] * 8)) == {'updated': 0, 'stale': 8}
    assert buf.stats()['stale_updates'] == stats['stale_updates'] + 8
    assert buf.stats()['updated'] == stats['updated']
    assert_same(case.without_counters(buf.state_dict()), before, 'state after a stale update')
    # partly stale: the items pushed after the sample replaced some of the sampled ones
    batch = case.sample(buf, 8)
    pushed = case.fill(buf, rng, 5, start=pushed, log=log)
    kept = case.stored_numbers(log)
    expect_stale = sum(n not in kept for n in case.numbers_of(batch))
    assert 0 < expect_stale < 8  # (fixed seeds: the partial case is exercised)
    stats = buf.stats()
    assert buf.update(case.update_info(batch, [5.0] * 8)) == {'updated': 8 - expect_stale, 'stale': expect_stale}
    assert buf.stats()['stale_updates'] == stats['stale_updates'] + expect_stale
    # a fresh sample's update applies to every item
    fresh = case.sample(buf, 8)
    stats = buf.stats()
    assert buf.update(case.update_info(fresh, [5.0] * 8)) == {'updated': 8, 'stale': 0}
    assert buf.stats()['updated'] == stats['updated'] + 8
    assert buf.stats()['stale_updates'] == stats['stale_updates']
    buf.close()


# ================================================================================ 6. close
class FakeWriter:
    """A borrowed TensorBoard writer: records scalars, owns no thread."""

    def __init__(self):
        self.scalars = []
        self.closed = False

    def add_scalar(self, tag, value, step=None, *args, **kwargs):
        self.scalars.append((tag, value, step))

    def flush(self):
        pass

    def close(self):
        self.closed = True


def _monitored(case, tmp_path, tracked_files):
    """A buffer with every helper thread its type has: an owned TensorBoard writer (advanced, GFlowNet), the
    periodic thruput report (advanced; naive, sequence, elastic and episode report to a borrowed writer) and the
    used-data remover (list storage of naive / advanced / sequence). The deque (which writes to its borrowed
    writer inside sample) and the chunk buffer start no thread."""
    kwargs = {'exp_name': str(tmp_path / 'exp')}
    if case.preset == 'advanced':
        over = {
            'monitor': {
                'tensorboard': True,
                'periodic_thruput': {'seconds': 0.05},
                'sampled_data_attr': {'average_range': 2, 'print_freq': 1},
            }
        }
    elif case.gfn:
        over = {'monitor': {'tensorboard': True, 'log_every': 1}}
    elif case.preset in ('deque', 'chunk'):
        over = {}
        kwargs['tb_logger'] = FakeWriter()
    else:
        over = {'periodic_thruput_seconds': 0.05 if case.preset in ('naive', 'sequence') else 1}  # episode: an int
        kwargs['tb_logger'] = FakeWriter()
    if tracked_files is not None:
        over['enable_track_used_data'] = True
    return create_buffer(case.cfg(tmp_path, **over), **kwargs)


@all_cases
def test_close_is_idempotent_and_a_closed_buffer_refuses_pushes(case, tmp_path):
    rng = np.random.default_rng(9)
    buf = _monitored(case, tmp_path, None)
    case.fill(buf, rng, case.cap + 4)
    batch = case.sample(buf, 4)
    assert batch is not None
    count, state = buf.count(), buf.state_dict()
    buf.close()
    buf.close()  # idempotent
    with pytest.raises(RuntimeError):
        buf.push(case.data(rng, 1, start=999))
    with pytest.raises(RuntimeError, match='closed'):  # a closed buffer changes no more (its files stay)
        buf.clear()
    # every update, a no-op one included (a naive buffer's priority_info), as the docs say
    noop = {'replay_unique_id': ['0'], 'replay_buffer_idx': [0], 'priority': [1.0]}
    info = case.good_update(batch)[0] if case.takes_garbage_updates else noop
    for given in (info, 'garbage'):  # a closed buffer refuses even bad information, as push does bad data
        with pytest.raises(RuntimeError, match='closed'):
            buf.update(given)
    if case.preset == 'elastic':
        for size in (3, -1):
            with pytest.raises(RuntimeError, match='closed'):
                buf.resize(size)
    assert buf.count() == count  # data stays readable, unchanged
    assert_same(buf.state_dict(), state)


@all_cases
def test_close_joins_every_helper_thread(case, tmp_path):
    case.require('helper threads')
    baseline_threads = set(threading.enumerate())
    baseline = threading.active_count()
    rng = np.random.default_rng(9)
    tracked = [] if case.preset in ('naive', 'advanced', 'sequence') and case.storage == 'list' else None
    buf = _monitored(case, tmp_path, tracked)
    if tracked is not None:
        for i in range(case.cap + 4):
            f = tmp_path / f'item{i}.bin'
            f.write_bytes(b'x')
            tracked.append(f)
            buf.push(dict(case.item(rng, i), data_id=str(f)))
    else:
        case.fill(buf, rng, case.cap + 4)
    for _ in range(3):
        batch = case.sample(buf, 4)
        assert batch is not None
        if case.prioritized:
            buf.update(case.update_info(batch, [1.0] * 4))
    time.sleep(0.12)  # let periodic monitors run a period
    assert threading.active_count() > baseline, 'the monitors (and remover) should run in threads'
    count = buf.count()
    buf.close()
    buf.close()  # idempotent
    ok = wait_until(lambda: threading.active_count() <= baseline, timeout=30.0)
    left = [t.name for t in threading.enumerate() if t not in baseline_threads and t.is_alive()]
    assert ok and not left, f'threads still alive after close(): {left}'
    if tracked is not None:  # the evicted items' files are deleted by the time close() returns
        assert [f.exists() for f in tracked] == [False] * 4 + [True] * case.cap
    with pytest.raises(RuntimeError):
        buf.push(case.data(rng, 1, start=999))
    assert buf.count() == count  # data stays readable
    assert buf.state_dict() is not None


# ================================================================================ 7. thread stress
@all_cases
def test_concurrent_push_sample_update_keep_the_buffer_consistent(case, tmp_path):
    buf = case.make(tmp_path, 'a')
    case.fill(buf, np.random.default_rng(10), 6)
    pushes, samples = [0] * 3, [0] * 2
    # the deque's update applies to the last sampled batch, which the other sampler's update may have consumed
    answers = (0, 3) if case.updates_last_batch else (3,)

    def pusher(k):
        def work(stop):
            rng = np.random.default_rng(100 + k)
            nxt = 10**6 * (k + 1)  # (the chunk buffer: worker k + 1)
            while not stop.is_set():
                n = int(rng.integers(1, 4))
                buf.push(case.data(rng, n, start=nxt))
                nxt += n
                pushes[k] += 1
                assert buf.count() <= case.cap

        return work

    def sampler(k):
        def work(stop):
            rng = np.random.default_rng(200 + k)
            while not stop.is_set():
                batch = case.sample(buf, 3, second=bool(k))
                if batch is None:
                    continue
                samples[k] += 1
                if case.prioritized:
                    result = buf.update(case.update_info(batch, rng.uniform(0.1, 2.0, size=3)))
                    assert result['updated'] + result['stale'] in answers, result

        return work

    run_threads([pusher(k) for k in range(3)] + [sampler(k) for k in range(2)], seconds=STRESS_SECONDS)
    assert min(pushes) > 0 and min(samples) > 0
    assert 0 < buf.count() <= case.cap
    state = buf.state_dict()
    other = case.make(tmp_path, 'b')
    other.load_state_dict(state)
    assert other.count() == buf.count()
    assert_same(other.state_dict(), state)
    assert case.sample(other, 3) is not None
    buf.close()
    other.close()
