"""``ChunkTable``: the table of ``chunk`` -- MineStudio's online replay protocol (fragments in, whole chunks out).

Producers push *fragments* -- fixed-length pieces of one environment's rollout -- tagged with the environment
(``worker``), a per-worker sequence number (``fid``), the ``model_version`` whose policy produced it and a
``session_id``. The buffer assembles each worker's consecutive fragments into *chunks* of ``fragments_per_chunk``,
keeps at most ``max_chunks`` chunks, and a learner samples whole chunks, each at most ``max_reuse`` times. Payloads
live in a ``FragmentStore`` (memory, or files on disk that producers and learners share, ids on the wire); the
buffer holds ids and deletes a payload once nothing refers to it.

The rules, in order (``tests/buffers/test_chunk.py`` checks every call against a brute-force model of them):

1. **Order per worker.** A worker's ``fid`` must exceed every ``fid`` it sent before, and be exactly the previous
   one + 1 while a chunk is being assembled. A gap, repeat or reordering is a ``ValueError`` naming the worker and
   both numbers; nothing changes. (MineStudio asserts inside its actor, killing the call.) A list push is the same
   fragments pushed one by one (a stale fragment dropped on arrival leaves no chunk in assembly, so the next one
   may skip ahead), all or nothing: if any one of them would be refused, none is stored.
2. **Gating at the worker's queue.** After a fragment is appended, fragments at the front of its worker's queue
   that are stale (``model_version - version > max_staleness``) or from another session (once a session is set)
   are dropped.
3. **Chunks.** A queue holding ``fragments_per_chunk`` fragments becomes a chunk with the version and session of
   its first fragment.
4. **Capacity.** FIFO in chunks: the oldest chunk leaves to make room -- only when the new chunk is accepted
   (MineStudio also evicts for a chunk it then rejects).
5. **New model version** (``update_model_version(version, session_id)``): every stale or other-session chunk
   leaves, wherever it is (MineStudio looks only at the oldest chunk). A worker's queue loses only a prefix, as
   MineStudio's (which pops from the front): every fragment up to its newest stale or other-session one, fresh
   ones before it included (they could no longer form a chunk of consecutive fragments); all are counted in
   ``fragments_dropped``. So a queue always holds consecutive fids ending at the worker's last one.
6. **Sampling** (``sample(n)``, ``n`` fragments = ``n / fragments_per_chunk`` chunks): distinct chunks drawn
   uniformly without replacement, each chunk's fragments in order. A drawn chunk's use count goes up by one; a
   chunk used ``max_reuse`` times leaves. With fewer chunks than needed: ``None``, or with ``timeout=`` seconds
   a wait for producers (``SampleTimeoutError`` when they do not deliver in time).
7. **Payloads.** Referenced by the receive queues, the chunks and the last sample (so a learner can still read
   the fragments it was given); a payload no longer referenced is deleted from the store.

A sampled fragment is a dict: ``worker``, ``fid``, ``model_version``, ``session_id``, ``fragment_id``, ``chunk``
(the chunk's id), ``use`` (its use count after this draw) and, unless ``sample_payloads=False``, ``data`` (the
payload; with a shared disk store and ``sample_payloads=False`` only ids travel, and learners read
``FragmentStore('disk', path).get(fragment_id)`` themselves). ``data`` is a fresh copy with either store (the memory
store keeps a deep copy of what was pushed and hands out deep copies): a learner may edit a sample in place, and a
producer may reuse its tensors after a push, without changing what a later sample of the same chunk returns.
"""

import itertools
import math
from collections import OrderedDict
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch

from ..config import INF
from ..control.limiter import limiter_config
from ..control.limits import UseLimit, build_remover
from ..persistence import refuse_unknown
from ..storage.base import NO_ITER
from ..storage.fragment_store import FragmentStore, check_id, numpy_globals
from .common import ENGINE_KEYS, MAX_NAME, check_derived, check_size, check_step, check_wait_timeout, checked_session
from .table import Drawn, Needs, Request, Restored, Table, Write, Written

_NO_SLOTS = np.empty(0, dtype=np.int64)
# (worker, fid, model_version, session_id, fragment_id)
Record = Tuple[str, int, int, str, str]
MAX_WORKERS = 1 << 16  # workers whose order is tracked: a bound on what a peer inventing names can make us keep
INT_LIMIT = 1 << 62


# exactly what ``torch.load(weights_only=True)`` rebuilds: these classes, not subclasses of them (an EasyDict, a
# namedtuple, an IntEnum or a tensor subclass pickles as its own class, which such a load refuses to import)
_PLAIN_MAPS = (dict, OrderedDict)
_PLAIN_SEQS = (list, tuple, torch.Size)
_TENSORS = (torch.Tensor, torch.nn.Parameter)
_PLAIN_LEAVES = (int, float, bool, str, bytes, type(None))
_PLAIN_KEYS = (str, int, bool, np.str_)


def check_plain(obj: Any, what: str, depth: int = 0) -> None:
    """``obj`` is what ``torch.load(weights_only=True)`` reads back (tensors, arrays, numbers, strings, None in
    dicts / lists / tuples, each of exactly that class): a disk store refuses anything else at push, instead of
    failing every later read."""
    if depth > 32:
        raise ValueError(f"{what} is nested more than 32 levels deep")
    t = type(obj)
    if t in _PLAIN_MAPS:
        for k, v in obj.items():
            if type(k) not in _PLAIN_KEYS:
                raise TypeError(f"{what} has a key of type {type(k).__name__}; a disk store keeps str / int keys")
            check_plain(v, f'{what}[{k!r:.40}]', depth + 1)
    elif t in _PLAIN_SEQS:
        for i, v in enumerate(obj):
            check_plain(v, f'{what}[{i}]', depth + 1)
    elif t in _TENSORS:
        if obj.__dict__:  # Python attributes set on a tensor are saved with it (and read back by the same rules)
            check_plain(obj.__dict__, f'{what} (its attributes)', depth + 1)
    elif t not in _PLAIN_LEAVES and not (isinstance(obj, (np.ndarray, np.generic)) and _plain_numpy(obj)):
        kind = (
            ' (a subclass: convert it to its base class)'
            if isinstance(obj, (dict, list, tuple, str, int, float))
            else ''
        )
        raise TypeError(
            f"{what} holds a {t.__name__}{kind}; a disk store keeps tensors, arrays, numbers, strings and None in "
            f"dicts / lists / tuples (read back without running code)"
        )


def _plain_numpy(x: Any) -> bool:
    """A numpy array or scalar the payload files read back: of numpy's own class (a recarray, masked array, matrix,
    memmap or record pickles as its subclass) and a dtype holding no object (nor numpy 2's variable-width strings)."""
    plain = type(x) is np.ndarray or isinstance(x, np.generic) and type(x) is not np.record
    return plain and not x.dtype.hasobject and x.dtype.kind != 'T'


def is_int(x: Any) -> bool:
    """An int (a numpy int too), not a bool."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def checked_version(version: Any) -> int:
    """A model version: an int in [-1, 2**62) (``ValueError`` naming it otherwise)."""
    if not is_int(version) or not -1 <= version < INT_LIMIT:
        raise ValueError(f"model version must be an int in [-1, 2**62), got {version!r:.40}")
    return int(version)


def saved_name(x: Any, what: str, empty: bool = False) -> str:
    """A worker or session name read from a state (printable, at most ``MAX_NAME`` characters)."""
    if not isinstance(x, str) or len(x) > MAX_NAME or not x.isprintable() or (not x and not empty):
        raise ValueError(f"invalid {what} {x!r:.60} in state")
    return x


def saved_number(x: Any, what: str, low: int = -1) -> int:
    if not is_int(x) or not low <= x < INT_LIMIT:
        raise ValueError(f"invalid {what} {x!r:.40} in state")
    return int(x)


def saved_record(r: Any) -> Record:
    worker, fid, version, session, fragment_id = r
    return (
        saved_name(worker, 'worker'),
        saved_number(fid, 'fid'),
        saved_number(version, 'model_version'),
        saved_name(session, 'session_id', empty=True),
        check_id(fragment_id),
    )


def saved_run(records: List[Record], what: str) -> List[Record]:
    """``records``, checked to be one worker's consecutive fids (rule 1)."""
    if any(r[0] != records[0][0] or r[1] != records[0][1] + i for i, r in enumerate(records)):
        raise ValueError(f"{what} in state is not one worker's consecutive fragments")
    return records


class ChunkTable(Table):
    """
    Overview:
        Chunks of one worker's consecutive fragments, their receive queues and payload references (see the module
        docstring). ``count()`` is the number of chunks; the engine's limiter paces ``sample(timeout=)`` waits.
    """

    state_keys = frozenset(
        {'model_version', 'session_id', 'next_uid', 'chunks', 'queues', 'last_fid', 'last_fetch', 'counters', 'engine'}
        | {'payloads'}
    )

    @property
    def store(self) -> FragmentStore:
        """Where the payloads live (``FragmentStore``: memory, or files producers and learners share)."""
        return self._fragments

    def file_globals(self) -> tuple:
        """A disk store keeps plain data only: its buffer's files name numpy arrays, as its payload files do."""
        return numpy_globals() if self._fragments.kind == 'disk' else ()

    # a chunk table has no slots: no element is old, stale or live for the engine's removers (it takes none)
    def oldest(self, k: int) -> np.ndarray:
        return np.empty(0, dtype=np.int64)

    def ordered_slots(self) -> np.ndarray:
        return np.empty(0, dtype=np.int64)

    def live(self, slots: np.ndarray) -> np.ndarray:
        return np.zeros(len(slots), dtype=bool)

    def collect_iter(self, slots: np.ndarray) -> np.ndarray:
        return np.full(len(slots), NO_ITER, dtype=np.int64)

    def next_id(self) -> int:
        return self._next_uid

    def derived(self) -> Dict[str, int]:
        """The engine's removal counters, in chunks: every chunk that left, those retired by ``max_reuse`` (the
        chunk table's ``max_use``) and those dropped as stale by a new model version."""
        return self._derived(self.tally)

    @staticmethod
    def _derived(c: Mapping) -> Dict[str, int]:
        return {
            'remove_count': c['chunks_left'],
            'removed_by_use': c['chunks_retired'],
            'removed_by_staleness': c['chunks_dropped_stale'],
        }

    def release(self) -> None:
        """Payloads stay in their store (a disk store is shared with producers and learners)."""
        self._fragments.release()

    def describe(self) -> str:
        return f"chunks={len(self._chunks)}, max_chunks={self.cfg.max_chunks}, store={self._fragments.kind!r}"

    # ------------------------------------------------------------------ build
    def build(self) -> Needs:
        cfg = self.cfg
        rules = [build_remover(x, f'removers[{i}]') for i, x in enumerate(cfg.removers)]  # arguments checked
        limits = [r.max_use for r in rules if isinstance(r, UseLimit) and r.max_use != INF]
        if limits:  # a max_use rule is max_reuse by another name: the smallest limit applies (use >= 2.5: 3 uses)
            cfg.max_reuse = min([math.ceil(x) for x in limits] + ([cfg.max_reuse] if cfg.max_reuse is not None else []))
        # the engine's parts: no removal rule besides the chunk table's own (capacity, max_reuse, staleness), and
        # a limiter that only paces sample(timeout=) waits (refusing pushes would break a worker's run of fragments)
        self._fragments = FragmentStore(cfg.store.type, cfg.store.path)
        if cfg.store.clear_on_start:
            self._fragments.clear()
        self._fpc = int(cfg.fragments_per_chunk)
        self._reset()
        self.model_version = -1
        self.session_id = ''
        return Needs(0, rules=[], limiter=limiter_config(0.0), monitors=False)

    def _reset(self) -> None:
        self._chunks: List[Dict[str, Any]] = []  # oldest first: {'uid', 'use', 'version', 'session', 'records'}
        self._held = 0  # fragments in the chunks (``stats``: kept as chunks come and leave, not summed per call)
        self._queues: Dict[str, List[Record]] = {}
        self._last_fid: 'OrderedDict[str, int]' = OrderedDict()
        self._last_fetch: List[str] = []
        self._refs: Dict[str, int] = {}
        self._sizes: Dict[str, int] = {}  # on-disk bytes of each referenced payload, and their total
        self._bytes = 0
        self._next_uid = 0
        self.tally = dict(
            fragments_received=0,
            fragments_dropped=0,
            chunks_made=0,
            chunks_evicted=0,
            chunks_retired=0,
            chunks_dropped_stale=0,
            sample_calls=0,
            sampled_fragments=0,
            reuse_sum=0,
            chunks_left=0,
        )

    def capacity(self) -> int:
        """Capacity in fragments (``max_chunks * fragments_per_chunk``): the most one sample can return."""
        return int(self.cfg.max_chunks) * self._fpc

    # ------------------------------------------------------------------ references
    def _ref(self, fragment_id: str) -> None:
        n = self._refs.get(fragment_id, 0)
        if not n:  # the bytes of referenced payloads are kept as a running total: stats() stays O(1)
            self._fragments.hold(fragment_id)
            self._sizes[fragment_id] = self._fragments.size(fragment_id)
            self._bytes += self._sizes[fragment_id]
        self._refs[fragment_id] = n + 1

    def _unref(self, fragment_id: str) -> None:
        n = self._refs[fragment_id] - 1
        if n:
            self._refs[fragment_id] = n
        else:
            del self._refs[fragment_id]
            self._bytes -= self._sizes.pop(fragment_id, 0)
            self._fragments.delete(fragment_id)

    def _stale(self, version: int, session: str) -> bool:
        if self.session_id and session != self.session_id:
            return True
        lag = self.cfg.max_staleness
        return lag is not None and self.model_version - version > lag

    # ------------------------------------------------------------------ push
    def prepare_batch(self, batch: Any) -> Write:
        raise ValueError(
            "the chunk buffer takes fragments: push one fragment dict or a list of them "
            "(batched=True / extend have no meaning here)"
        )

    def _check_fragment(self, f: Any, i: int) -> Tuple[str, int, int, str]:
        if not isinstance(f, dict):
            raise TypeError(
                f"fragment {i} must be a dict with 'worker', 'fid', 'model_version' and 'data' or "
                f"'fragment_id', got {type(f).__name__}"
            )
        extra = sorted(
            str(k) for k in f if k not in ('worker', 'fid', 'model_version', 'session_id', 'data', 'fragment_id')
        )
        if extra:
            raise ValueError(
                f"fragment {i} has unknown keys {extra[:5]}; expected 'worker', 'fid', 'model_version', "
                f"'session_id', and 'data' or 'fragment_id'"
            )
        worker, fid, version, session = f.get('worker'), f.get('fid'), f.get('model_version'), f.get('session_id', '')
        if not isinstance(worker, str) or not 0 < len(worker) <= MAX_NAME or not worker.isprintable():
            raise ValueError(
                f"fragment {i}: 'worker' must be a printable str of 1..{MAX_NAME} characters, got {worker!r:.60}"
            )
        for key, value in (('fid', fid), ('model_version', version)):
            if not is_int(value) or not -1 <= value < INT_LIMIT:
                raise ValueError(f"fragment {i}: {key!r} must be an int in [-1, 2**62), got {value!r:.40}")
        if not isinstance(session, str) or len(session) > MAX_NAME or not session.isprintable():
            raise ValueError(
                f"fragment {i}: 'session_id' must be a printable str of at most {MAX_NAME} characters, "
                f"got {session!r:.60}"
            )
        if ('data' in f) == ('fragment_id' in f):
            raise ValueError(
                f"fragment {i} must carry exactly one of 'data' (the payload) and 'fragment_id' (a "
                f"payload already in the store)"
            )
        if 'fragment_id' in f:
            check_id(f['fragment_id'])
            if f['fragment_id'] in self._refs:
                raise ValueError(f"fragment {i}: fragment_id {f['fragment_id']} is already in the buffer")
            if f['fragment_id'] not in self._fragments:
                raise ValueError(
                    f"fragment {i}: fragment_id {f['fragment_id']} is not in the store "
                    f"({self._fragments.kind}{': ' + self._fragments.path if self._fragments.path else ''})"
                )
        return worker, int(fid), int(version), session

    def _plan(self, checked: List[Tuple[str, int, int, str]]) -> List[List[str]]:
        """
        Overview:
            Rules 1-3 and the worker cap run over the whole call on shadows first, exactly as for the same fragments
            pushed one by one (a stale fragment dropped on arrival leaves no chunk in assembly, so the next one may
            skip ahead; a worker whose chunk completes earlier in the call may be forgotten for a later new one).
            Raises the ``ValueError`` the first refused single push would raise, before anything changes; else
            returns, per fragment, the workers to forget before it is received.
        """
        # workers this call touched, least recently first (None: forgotten in this call), and their queues as the
        # stale flags of the fragments in them (the model version cannot move during a push)
        last: 'OrderedDict[str, Optional[int]]' = OrderedDict()
        queues: Dict[str, List[bool]] = {}
        known, plan = len(self._last_fid), []
        for i, (worker, fid, version, session) in enumerate(checked):
            if worker not in last:
                last[worker] = self._last_fid.get(worker)
                queues[worker] = [self._stale(r[2], r[3]) for r in self._queues.get(worker, ())]
            prev, queue = last[worker], queues[worker]
            if prev is not None and (fid != prev + 1 if queue else fid <= prev):
                want = f"exactly {prev + 1} (a chunk is being assembled)" if queue else f"more than {prev}"
                raise ValueError(
                    f"fragment {i}: worker {worker!r} sent fid {fid} after {prev}; expected {want}. "
                    f"Fragments of one worker arrive in order"
                )
            forget: List[str] = []
            if prev is None:  # a new worker: the order of at most MAX_WORKERS workers is remembered, the least
                excess = known + 1 - MAX_WORKERS  # recently seen ones without a chunk in assembly are forgotten first
                if excess > 0:  # (a forgotten worker may start again at any fid)
                    idle = (w for w in self._last_fid if w not in last and w not in self._queues)
                    idle_here = (w for w, f in last.items() if f is not None and not queues[w] and w != worker)
                    forget = list(itertools.islice(itertools.chain(idle, idle_here), excess))
                    if len(forget) < excess:
                        raise ValueError(
                            f"fragment {i}: {MAX_WORKERS} workers have chunks in assembly; worker {worker!r:.40} "
                            f"is one more"
                        )
                    for w in forget:
                        last[w], queues[w] = None, []
                    known -= len(forget)
                known += 1
            last[worker] = fid
            last.move_to_end(worker)
            queue.append(self._stale(version, session))
            while queue and queue[0]:  # rule 2
                queue.pop(0)
            if len(queue) >= self._fpc:  # rule 3
                queue.clear()
            plan.append(forget)
        return plan

    def prepare(self, items: List[Any]) -> Write:
        checked = [self._check_fragment(f, i) for i, f in enumerate(items)]
        plan = self._plan(checked)  # the whole call first, so a bad fragment anywhere changes nothing
        ids = set()
        for i, f in enumerate(items):
            fragment_id = f.get('fragment_id')
            if fragment_id is not None:
                if fragment_id in ids:
                    raise ValueError(f"fragment {i}: fragment_id {fragment_id} appears twice in this push")
                ids.add(fragment_id)
        if self._fragments.kind == 'disk':
            for i, f in enumerate(items):
                if 'data' in f:
                    check_plain(f['data'], f'fragment {i} data')
        return Write(len(items), (items, checked, plan))

    def write(self, w: Write, report_evicted: bool) -> Written:
        """The payloads first (a store that fails, e.g. a full disk, leaves the buffer as it was), then each
        fragment is received: rules 2-4 assemble and evict chunks."""
        items, checked, plan = w.plan
        put: List[str] = []
        try:  # payloads first: a store that fails (disk full) leaves the buffer as it was
            for f in items:
                put.append(f['fragment_id'] if 'fragment_id' in f else self._fragments.put(f['data']))
        except BaseException:
            self._fragments.delete_all(fid for f, fid in zip(items, put) if 'fragment_id' not in f)
            raise
        for (worker, fid, version, session), fragment_id, forget in zip(checked, put, plan):
            for w in forget:
                del self._last_fid[w]
            self._receive((worker, fid, version, session, fragment_id))
        return Written(len(items))  # counted; samplers waiting for chunks wake

    def _receive(self, rec: Record) -> None:
        worker = rec[0]
        self.tally['fragments_received'] += 1
        self._last_fid[worker] = rec[1]
        self._last_fid.move_to_end(worker)
        queue = self._queues.setdefault(worker, [])
        queue.append(rec)
        self._ref(rec[4])
        while queue and self._stale(queue[0][2], queue[0][3]):  # rule 2
            self.tally['fragments_dropped'] += 1
            self._unref(queue.pop(0)[4])
        if not queue:
            del self._queues[worker]
        elif len(queue) >= self._fpc:  # rule 3
            del self._queues[worker]
            self._add_chunk(queue)

    def _add_chunk(self, records: List[Record]) -> None:
        version, session = records[0][2], records[0][3]
        if self._stale(version, session):  # cannot happen after rule 2; kept so the rule has one place
            self.tally['chunks_dropped_stale'] += 1
            for r in records:
                self._unref(r[4])
            return
        while len(self._chunks) >= self.cfg.max_chunks:  # rule 4: only for a chunk that is accepted
            self.tally['chunks_evicted'] += 1
            self._leave(self._chunks.pop(0))
        self._chunks.append(
            {'uid': self._next_uid, 'use': 0, 'version': version, 'session': session, 'records': records}
        )
        self._held += len(records)
        self._next_uid += 1
        self.tally['chunks_made'] += 1

    def _leave(self, chunk: Dict[str, Any]) -> None:
        self.tally['reuse_sum'] += chunk['use']
        self.tally['chunks_left'] += 1
        self._held -= len(chunk['records'])
        for r in chunk['records']:
            self._unref(r[4])

    # ------------------------------------------------------------------ model version
    def update_model_version(self, version: int, session_id: Optional[str] = None) -> Dict[str, Any]:
        """See ``ChunkReplayBuffer.update_model_version``."""
        version = checked_version(version)
        if session_id is not None:
            session_id = checked_session(session_id)
        with self.lock:
            self.model_version = int(version)
            if session_id is not None:
                self.session_id = session_id
            keep, chunks_left = [], 0
            for chunk in self._chunks:
                if self._stale(chunk['version'], chunk['session']):
                    chunks_left += 1
                    self.tally['chunks_dropped_stale'] += 1
                    self._leave(chunk)
                else:
                    keep.append(chunk)
            self._chunks = keep
            fragments_left = 0
            for worker in list(self._queues):
                # a queue only loses a prefix: its fragments up to the newest stale one (the fresh ones before it
                # could no longer join the ones after it in a chunk of consecutive fids), so what stays is still
                # consecutive and ends at the worker's last fid -- as MineStudio, which pops from the front only
                queue = self._queues[worker]
                cut = max((i + 1 for i, r in enumerate(queue) if self._stale(r[2], r[3])), default=0)
                if not cut:
                    continue
                fragments_left += cut
                for r in queue[:cut]:
                    self._unref(r[4])
                if cut < len(queue):
                    self._queues[worker] = queue[cut:]
                else:
                    del self._queues[worker]
            self.tally['fragments_dropped'] += fragments_left
            return {
                'model_version': self.model_version,
                'session_id': self.session_id,
                'chunks_dropped': chunks_left,
                'fragments_dropped': fragments_left,
            }

    # ------------------------------------------------------------------ sample
    def request(self, size: int, timeout: Optional[float] = None, learner_iter: Any = None, /, **kw: Any) -> Request:
        """``size`` fragments: ``size / fragments_per_chunk`` distinct chunks, uniformly, their fragments in order
        (rule 6); ``None`` while fewer chunks are stored, or with ``timeout`` (seconds) a wait for them.
        ``learner_iter`` is checked as every type's and not read (None is taken: MineStudio's sample has none)."""
        if learner_iter is not None:
            check_step(learner_iter, 'cur_learner_iter')
        if kw:
            raise TypeError(
                f"the chunk buffer's sample takes no {sorted(kw)[:4]} (it draws whole chunks without replacement)"
            )
        check_size(size)
        if size % self._fpc:
            raise ValueError(f"sample size {size} must be a multiple of fragments_per_chunk={self._fpc} (whole chunks)")
        k = size // self._fpc
        if k > self.cfg.max_chunks:
            raise ValueError(f"sample size {size} is {k} chunks; at most max_chunks={self.cfg.max_chunks} exist")
        timeout = check_wait_timeout(timeout)  # (0: no wait, SampleTimeoutError at once, as on every type)
        return Request(size, lambda rng: self.draw(rng, k), lambda: self.shortfall(k), timeout)

    def shortfall(self, k: int) -> str:
        """Why ``k`` chunks cannot be drawn now ('' when they can)."""
        n = len(self._chunks)
        return '' if n >= k else f"{n} of the {k} chunks needed are stored"

    def wait_what(self, size: int) -> str:
        return f"buffer '{self.name}' could not sample {size // self._fpc} chunks"

    def units(self) -> int:
        """Chunks, the sampling unit, are what a sample waits for (``shortfall``): the limiter only paces."""
        return len(self._chunks)

    def draw(self, rng: np.random.Generator, k: int) -> Any:
        why = self.shortfall(k)
        if why:
            return why
        rng_state = rng.bit_generator.state
        picked = [int(j) for j in rng.choice(len(self._chunks), size=k, replace=False)]
        ids = [r[4] for j in picked for r in self._chunks[j]['records']]
        payloads = {}
        if self.cfg.sample_payloads:  # read first: a payload that cannot be read changes nothing
            try:
                payloads = {fragment_id: self._fragments.get(fragment_id) for fragment_id in ids}
            except BaseException:
                rng.bit_generator.state = rng_state
                raise
        out, retired = [], set()
        for j in picked:
            chunk = self._chunks[j]
            chunk['use'] += 1
            for worker, fid, version, session, fragment_id in chunk['records']:
                item = {
                    'worker': worker,
                    'fid': fid,
                    'model_version': version,
                    'session_id': session,
                    'fragment_id': fragment_id,
                    'chunk': chunk['uid'],
                    'use': chunk['use'],
                }
                if self.cfg.sample_payloads:
                    item['data'] = payloads[fragment_id]
                out.append(item)
            if self.cfg.max_reuse is not None and chunk['use'] >= self.cfg.max_reuse:
                retired.add(j)
        for fragment_id in ids:  # rule 7: the last sample holds its fragments until the next one
            self._ref(fragment_id)
        old, self._last_fetch = self._last_fetch, ids
        for j in sorted(retired, reverse=True):
            self.tally['chunks_retired'] += 1
            self._leave(self._chunks.pop(j))
        for fragment_id in old:
            self._unref(fragment_id)
        self.tally['sample_calls'] += 1
        self.tally['sampled_fragments'] += len(out)
        return Drawn(_NO_SLOTS, len(out), out)  # the engine's sample counters (no slots: chunks have no use column)

    # ------------------------------------------------------------------ count / stats
    def count(self) -> int:
        """Chunks stored (the sampling unit)."""
        return len(self._chunks)

    def stats(self, out: Dict[str, Any]) -> Dict[str, Any]:
        c = self.tally
        out.update(
            count=len(self._chunks),
            chunks=len(self._chunks),
            fragments=self._held,
            queued_fragments=sum(len(q) for q in self._queues.values()),
            workers=len(self._last_fid),
            payloads=len(self._refs),
            model_version=self.model_version,
            avg_reuse=c['reuse_sum'] / c['chunks_left'] if c['chunks_left'] else 0.0,  # of chunks that left
        )
        out.update({k: v for k, v in c.items() if k not in ('reuse_sum',)})
        out['store_bytes'] = self._bytes  # of the payloads this buffer refers to
        return out

    def records(self) -> Dict[str, Any]:
        """The chunks (oldest first: uid, use count, records) and the per-worker queues, as plain data."""
        with self.lock:
            return {
                'chunks': [(ch['uid'], ch['use'], [r[:4] for r in ch['records']]) for ch in self._chunks],
                'queues': {w: [r[:4] for r in q] for w, q in self._queues.items()},
            }

    # ------------------------------------------------------------------ state
    def state(self, engine: Dict[str, Any]) -> Dict[str, Any]:
        referenced = list(self._refs)
        return {
            'model_version': self.model_version,
            'session_id': self.session_id,
            'next_uid': self._next_uid,
            'chunks': [
                {
                    'uid': ch['uid'],
                    'use': ch['use'],
                    'version': ch['version'],
                    'session': ch['session'],
                    'records': [list(r) for r in ch['records']],
                }
                for ch in self._chunks
            ],
            'queues': {w: [list(r) for r in q] for w, q in self._queues.items()},
            'last_fid': dict(self._last_fid),
            'last_fetch': list(self._last_fetch),
            'counters': dict(self.tally),
            'engine': engine,  # the engine's counters (push_items, refused_sample, ...)
            'payloads': {fragment_id: self._fragments.get(fragment_id) for fragment_id in referenced},
        }

    def restore(self, state: Dict[str, Any]) -> Restored:
        """Validate ``state`` against the rules (a state this buffer could have reached), then swap it in."""
        last_fid = OrderedDict((saved_name(w, 'worker'), saved_number(f, 'fid')) for w, f in state['last_fid'].items())
        if len(last_fid) > MAX_WORKERS:
            raise ValueError(f"state tracks {len(last_fid)} workers, more than {MAX_WORKERS}")
        chunks = self._saved_chunks(state['chunks'])
        queues = self._saved_queues(state['queues'], last_fid)
        held = [r[4] for ch in chunks for r in ch['records']] + [r[4] for q in queues.values() for r in q]
        if len(set(held)) != len(held):
            raise ValueError("state holds one fragment id in two places")
        last_fetch = [check_id(x) for x in state['last_fetch']]
        refs: Dict[str, int] = {}
        for fragment_id in held + last_fetch:
            refs[fragment_id] = refs.get(fragment_id, 0) + 1
        payloads = state['payloads']
        missing = sorted(set(refs) - set(payloads))
        if missing:
            raise ValueError(f"state lacks the payloads of {len(missing)} fragments (e.g. {missing[0]})")
        if len(payloads) != len(refs):  # a state saves the payloads its fragments refer to: a lost chunk or queue
            raise ValueError(f"state holds {len(payloads) - len(refs)} payload(s) no chunk, queue or fetch refers to")
        if self._fragments.kind == 'disk':
            for fragment_id in refs:
                check_plain(payloads[fragment_id], f'the payload of fragment {fragment_id}')
        counters = {k: saved_number(state['counters'][k], f'counter {k}', 0) for k in self.tally}
        refuse_unknown(state['counters'], self.tally, "saved 'counters'")
        engine = state.get('engine') or {}
        if not isinstance(engine, dict):
            raise ValueError(f"state has an invalid 'engine' entry of type {type(engine).__name__}")
        refuse_unknown(engine, ENGINE_KEYS, "saved 'engine'")
        check_derived(engine.get('counters'), self._derived(counters), 'its chunk counters say')
        version = saved_number(state['model_version'], 'model_version')
        session = saved_name(state['session_id'], 'session_id', empty=True)
        next_uid = saved_number(state['next_uid'], 'next_uid', 0)
        if chunks and max(c['uid'] for c in chunks) >= next_uid:  # (uids are handed out from next_uid)
            raise ValueError(f"state holds chunk uid {max(c['uid'] for c in chunks)}, not below next_uid {next_uid}")

        def swap() -> None:
            self._put_payloads(refs, payloads)
            self._chunks, self._queues, self._last_fid, self._last_fetch = chunks, queues, last_fid, last_fetch
            self._held = sum(len(c['records']) for c in chunks)
            self._refs, self.tally, self._next_uid = refs, counters, next_uid
            for fragment_id in refs:
                self._fragments.hold(fragment_id)
            self._sizes = {fragment_id: self._fragments.size(fragment_id) for fragment_id in refs}
            self._bytes = sum(self._sizes.values())
            self.model_version, self.session_id = version, session

        return Restored(swap, engine)  # states saved before the engine's entry: counters at 0

    def _saved_chunks(self, saved: Any) -> List[Dict[str, Any]]:
        """The saved chunks, checked: one worker's ``fragments_per_chunk`` consecutive fragments each, distinct
        uids, under ``max_reuse`` and ``max_chunks`` (a chunk's fids may be past its worker's last one: a worker
        forgotten among ``MAX_WORKERS`` others may start again at any fid)."""
        chunks, uids = [], set()
        for ch in saved:
            if not isinstance(ch, dict):
                raise ValueError(f"a saved chunk must be a dict, got {type(ch).__name__}")
            refuse_unknown(ch, ('uid', 'use', 'version', 'session', 'records'), 'a saved chunk')
            records = saved_run([saved_record(r) for r in ch['records']], 'a chunk')
            uid, use = saved_number(ch['uid'], 'chunk uid', 0), saved_number(ch['use'], 'use count', 0)
            if len(records) != self._fpc or uid in uids:
                raise ValueError(
                    f"chunk {uid} in state has {len(records)} fragments (fragments_per_chunk="
                    f"{self._fpc}) or a repeated uid"
                )
            if self.cfg.max_reuse is not None and use >= self.cfg.max_reuse:
                raise ValueError(f"chunk {uid} in state was used {use} times; max_reuse is {self.cfg.max_reuse}")
            if (ch.get('version', records[0][2]), ch.get('session', records[0][3])) != records[0][2:4]:
                raise ValueError(f"chunk {uid} in state has a version or session other than its fragments'")
            uids.add(uid)
            chunks.append(
                {'uid': uid, 'use': use, 'version': records[0][2], 'session': records[0][3], 'records': records}
            )
        if len(chunks) > self.cfg.max_chunks:
            raise ValueError(f"state holds {len(chunks)} chunks, more than max_chunks={self.cfg.max_chunks}")
        return chunks

    def _saved_queues(self, saved: Any, last_fid: Dict[str, int]) -> Dict[str, List[Record]]:
        """The saved per-worker queues, checked: fewer than ``fragments_per_chunk`` consecutive fragments of the
        worker, ending at its last fid."""
        queues = {}
        for w, q in saved.items():
            records = saved_run([saved_record(r) for r in q], f"worker {w!r:.40}'s queue")
            if not 0 < len(records) < self._fpc or records[0][0] != w or last_fid.get(w) != records[-1][1]:
                raise ValueError(
                    f"worker {w!r:.40}'s queue in state does not fit fragments_per_chunk={self._fpc} or its last fid"
                )
            queues[w] = records
        return queues

    def _put_payloads(self, refs: Dict[str, int], payloads: Dict[str, Any]) -> None:
        """The store holds exactly the payloads of ``refs``: written first, those it held already too (a file of
        theirs may be damaged; a failure, e.g. a full disk, deletes the new ones and leaves the buffer as it was),
        then the ones no longer referenced deleted."""
        old, added = set(self._refs), []
        try:
            for fragment_id in refs:
                new = fragment_id not in self._fragments
                self._fragments.put_as(fragment_id, payloads[fragment_id])
                if new:
                    added.append(fragment_id)
        except BaseException:
            self._fragments.delete_all(added)
            raise
        self._fragments.delete_all(old - set(refs))

    def clear(self) -> List[Any]:
        """Every chunk, queued fragment and the last sample leave (their payloads are deleted); the model version,
        session and each worker's last ``fid`` stay (order continues)."""
        for chunk in self._chunks:  # (counted as any chunk that leaves; the payloads go all at once below)
            self.tally['reuse_sum'] += chunk['use']
        self.tally['chunks_left'] += len(self._chunks)
        self._fragments.delete_all(list(self._refs))
        last_fid, counters, uid = self._last_fid, self.tally, self._next_uid
        self._reset()
        self._last_fid, self.tally, self._next_uid = last_fid, counters, uid
        return []


__all__ = ['ChunkTable', 'check_plain', 'checked_session', 'checked_version', 'is_int', 'INT_LIMIT']
