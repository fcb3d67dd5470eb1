"""``chunk`` -- ``ChunkReplayBuffer``: MineStudio's online replay protocol (fragments in, whole chunks out), the
engine over a ``ChunkTable`` (see ``chunk_table`` for the rules: order per worker, gating, chunks, capacity, new
model versions, sampling, payloads)."""

from typing import Any, Dict, List, Optional

from ..base import BUFFER_REGISTRY
from ..config import SEED_CHECK, dingengine_ignored
from ..storage.fragment_store import KINDS
from .chunk_table import INT_LIMIT, ChunkTable, checked_session, checked_version, is_int
from .engine import Engine, table_attribute

# the part keys every preset takes, as far as a table of whole chunks fits them (anything else: refused, saying why)
CHUNK_REMOVERS = ('fifo', 'max_use')


def _removers_ok(entries: Any) -> bool:
    """``removers``: a list of ``dict(type='fifo')`` (the chunk table's capacity order) and ``dict(type='max_use',
    max_use=k)`` (a chunk leaves after ``k`` samples, as ``max_reuse``); the entries' arguments are checked by the
    rules themselves (``build_remover``) when the buffer is built."""
    return isinstance(entries, (list, tuple)) and all(
        isinstance(e, dict) and e.get('type') in CHUNK_REMOVERS for e in entries
    )


def _sampler_ok(section: Any) -> bool:
    """``sampler``: ``{}`` or ``dict(type='uniform')`` -- whole chunks, uniformly, without replacement."""
    return isinstance(section, dict) and (not section or section == {'type': 'uniform'})


class ChunkReplayBuffer(Engine):
    """
    Overview:
        MineStudio's online replay (see the module docstring): fragments in, whole chunks of
        ``fragments_per_chunk`` consecutive fragments of one worker out. ``count()`` is the number of chunks.
    Examples:
        >>> import torch
        >>> from ding_buffer import create_buffer
        >>> buf = create_buffer(dict(type='chunk', fragments_per_chunk=2, max_reuse=1, seed=0))
        >>> frag = lambda worker, fid: dict(worker=worker, fid=fid, model_version=0, data={'obs': torch.zeros(3)})
        >>> buf.push([frag('w0', 0), frag('w0', 1), frag('w1', 0)]), buf.count()  # w1's chunk waits for fid 1
        (3, 1)
        >>> [(f['worker'], f['fid'], f['use'], tuple(f['data']['obs'].shape)) for f in buf.sample(2)]  # 1 chunk
        [('w0', 0, 1, (3,)), ('w0', 1, 1, (3,))]
        >>> buf.sample(2), buf.count()  # max_reuse=1: the chunk left
        (None, 0)
        >>> buf.close()
    """

    item_kind = 'chunk'
    version_gate = True

    config = dict(
        type='chunk',
        # capacity in chunks; the oldest chunk leaves first
        max_chunks=4800,
        # consecutive fragments of one worker that make a chunk (the sampling unit)
        fragments_per_chunk=1,
        # a chunk leaves after this many samples (1: never reused; None: only capacity or staleness remove it)
        max_reuse=2,
        # fragments / chunks more than this many model versions behind the current one are dropped (None: no gate)
        max_staleness=2,
        # payloads: 'memory' (in this process) or 'disk' (files under path, shareable by producers and learners)
        # clear_on_start: a disk store starts empty (files a crashed run left behind are deleted)
        store=dict(type='memory', path=None, clear_on_start=True),
        # sampled fragments carry their payload as 'data' (False: ids only, read from the store by the caller)
        sample_payloads=True,
        seed=None,
        # the part keys of every preset, as far as whole chunks fit them: removers [dict(type='fifo')] (the capacity
        # order it has) and [dict(type='max_use', max_use=k)] (with max_reuse, the smaller applies); sampler {} or
        # dict(type='uniform') (what it does); a rate limiter is not supported (thruput_controller stays None)
        removers=[],
        sampler={},
        thruput_controller=None,
    )
    key_aliases = {'max_use': 'max_reuse'}  # the engine presets' name of the key
    checks = {
        'max_chunks': (lambda x: is_int(x) and 1 <= x < INT_LIMIT, 'an int in [1, 2**62)'),
        'fragments_per_chunk': (lambda x: is_int(x) and 1 <= x <= 1 << 20, 'an int in [1, 2**20]'),
        'max_reuse': (lambda x: x is None or (is_int(x) and 1 <= x < INT_LIMIT), 'None or an int in [1, 2**62)'),
        'max_staleness': (lambda x: x is None or (is_int(x) and 0 <= x < INT_LIMIT), 'None or an int in [0, 2**62)'),
        'store.type': (lambda x: x in KINDS, f'one of {list(KINDS)}'),
        'store.path': (lambda x: x is None or (isinstance(x, str) and bool(x)), 'None or a directory path'),
        'store.clear_on_start': (lambda x: isinstance(x, bool), 'a bool'),
        'sample_payloads': (lambda x: isinstance(x, bool), 'a bool'),
        'seed': SEED_CHECK,
        'removers': (
            _removers_ok,
            "a list of dict(type='fifo') and dict(type='max_use', max_use=k): a chunk table evicts its oldest "
            "chunk and retires a chunk after k samples; other rules do not apply to whole chunks",
        ),
        'sampler': (_sampler_ok, "{} or dict(type='uniform'): whole chunks are drawn uniformly without replacement"),
        'thruput_controller': (
            lambda x: x is None,
            'None: a rate limiter refusing pushes would break a worker\'s run of consecutive fragments (a gap is '
            'an error), and sampling is already paced by whole chunks (sample(timeout=...) waits for them)',
        ),
    }

    table = ChunkTable
    # what DI-engine's compile_config merges into every buffer section (replay_buffer_size, ...): warned of, no effect
    ignored_keys = dingengine_ignored(config, 'chunk', "its capacity is 'max_chunks' chunks")

    store = table_attribute(
        'store', 'Where the payloads live (memory, or files under store.path shared by producers and learners).'
    )

    @property
    def capacity(self) -> int:
        """Capacity in fragments (``max_chunks * fragments_per_chunk``): the most one sample can return."""
        return self.replay_buffer_size

    model_version = table_attribute(
        'model_version',
        'The learner model version the gate measures staleness from (-1 before the first update).',
        check=checked_version,
    )

    session_id = table_attribute(
        'session_id',
        "The current session ('' before one is set): fragments and chunks of other sessions leave.",
        check=checked_session,
    )

    def update_model_version(self, version: int, session_id: Optional[str] = None) -> Dict[str, Any]:
        """
        Overview:
            The learner's policy moved to ``version`` (and ``session_id``, when given): stale and other-session
            chunks leave, and each worker's queue loses the prefix up to its newest stale or other-session
            fragment (rule 5). Returns how many chunks and queued fragments left.
        """
        return self._verb(self._t.update_model_version, version, session_id)

    def sample(
        self, size: int, cur_learner_iter: int = -1, timeout: Optional[float] = None, **kwargs: Any
    ) -> Optional[List[Dict[str, Any]]]:
        """
        Overview:
            ``size`` fragments: ``size / fragments_per_chunk`` distinct chunks, uniformly, their fragments in order
            (rule 6). ``None`` while fewer chunks are stored, or with ``timeout`` (seconds) wait for them and raise
            ``SampleTimeoutError`` when they do not come.
        """
        # chunks are gated by model version, not by learner iteration: cur_learner_iter is checked, not read
        return self._sample(-1, self._t.request(size, timeout, cur_learner_iter, **kwargs))

    def records(self) -> Dict[str, Any]:
        """The chunks (oldest first: uid, use count, records) and the per-worker queues, as plain data."""
        return self._t.records()


BUFFER_REGISTRY.register('chunk')(ChunkReplayBuffer)

__all__ = ['ChunkReplayBuffer']
