"""``MixtureReplayBuffer`` (``type='mixture'``): named member buffers sampled together -- offline data and online data
in one batch, as RLPD or Cal-QL fine-tuning sample them (TorchRL's ``ReplayBufferEnsemble``).

Each member is a whole buffer of its own (built by ``create_buffer`` from its config section, with its own eviction,
priorities, monitors and ``dataset``); the mixture only splits a sample between them, routes priority updates back,
and keeps their states together. It holds the members; they know nothing of it.
"""

import copy
import logging
import time
import types
from typing import Any, Dict, List, Mapping, NoReturn, Optional, Sequence

import numpy as np
import torch
from easydict import EasyDict

from .. import forks
from ..base import BUFFER_REGISTRY, IBuffer, create_buffer, get_buffer_cls
from ..config import (
    SEED_CHECK,
    build_config,
    check_section,
    deep_merge_dicts,
    dingengine_ignored,
    finite_number,
    plain_numbers,
)
from ..control.priority import as_numpy, as_priorities, parse_update
from ..errors import SampleTimeoutError
from ..persistence import load_state, restoring, save_state
from ..storage.base import SAMPLE_FIELDS
from ..storage.tensordict_io import is_tensordict, to_plain, to_tensordict, update_info
from .advanced import AdvancedReplayBuffer
from .common import (
    LOCK_GRACE,
    CallMarks,
    check_deepcopy,
    check_instance_name,
    check_size,
    check_state_type,
    check_step,
    check_wait_timeout,
    depth,
    new_rng,
    release_to,
    restored_rng,
    short_form,
)

MIXTURE_CONFIG = dict(
    type='mixture',
    # Member name -> that member's buffer config: any type whose items are transitions (naive, elastic, advanced),
    # with its own storage, eviction, priorities and `dataset` section. Every member uses the same storage kind.
    members=dict(offline=dict(type='naive'), online=dict(type='naive')),
    # {member: weight}: every sample takes n * weight / sum(weights) items from each member, exactly (the fractional
    # remainder goes to members drawn by the seed, so each member's mean share is exact); 'size': weights are the
    # members' counts at the time of the sample.
    weights='size',
    # The member push / extend write to (None: the last member); push(data, member=NAME) writes to another.
    push_to=None,
    # The field every sampled item gets naming its member: the name (list storage) or the member's position in
    # `member_names` (tensor storage, an int64 tensor).
    member_key='mixture_member',
    # Seed of the mixture's own RNG (the split of each sample); None draws it from numpy's global RNG.
    seed=None,
)
# fields the members' samples add to each item (ids, priorities, weights, counts): no member key may hide one
MIXTURE_CHECKS = dict(
    push_to=(lambda x: x is None or isinstance(x, str), 'None or a member name'),
    member_key=(
        lambda x: isinstance(x, str) and x != '' and x not in SAMPLE_FIELDS,
        f"a non-empty str other than the fields a sample adds {list(SAMPLE_FIELDS)}",
    ),
    seed=SEED_CHECK,
)
# member types that cannot serve in a mixture, and why
REFUSED_MEMBERS = {
    'deque': "its update applies to 'the last sampled batch' by position, which a mixture's sample is not",
    'mixture': 'a member cannot itself be a mixture',
}


# what DI-engine's compile_config merges into every buffer section (replay_buffer_size, ...): warned of, no effect
MIXTURE_IGNORED = dingengine_ignored(MIXTURE_CONFIG, 'mixture', 'each member reads its own section')


def _copied(section: Mapping) -> dict:
    """A member's section as the mixture keeps it: a deep copy (as every buffer copies its config), or a shallow
    one when a value cannot be copied -- the member's own check then names it (a bad key or value), or fails the
    same way as a buffer of its own."""
    try:
        return deep_merge_dicts(section, None)
    except Exception:
        return dict(section)


def mixture_config(cfg: Optional[Mapping]) -> EasyDict:
    """The validated config: ``members`` and ``weights`` are checked here (they are not merged into the defaults:
    the user's members replace the default ones), every other key by ``build_config``."""
    cfg = dict(cfg or {})
    members = cfg.pop('members', MIXTURE_CONFIG['members'])
    weights = plain_numbers(cfg.pop('weights', MIXTURE_CONFIG['weights']))
    # members and weights are checked below; None here keeps them among the valid keys (typo hints name them)
    out = build_config(
        {**MIXTURE_CONFIG, 'members': None, 'weights': None}, cfg, MIXTURE_CHECKS, ignored=MIXTURE_IGNORED
    )
    if not isinstance(members, Mapping) or not members:
        raise ValueError(f"config key 'members' must be a non-empty dict of name -> buffer config, got {members!r:.80}")
    for name, section in members.items():
        if not isinstance(name, str) or not name or not name.replace('_', '').isalnum():
            raise ValueError(f"config key 'members' has member name {name!r}; expected a non-empty identifier")
        if not isinstance(section, Mapping) or 'type' not in section:
            raise ValueError(f"config key 'members.{name}' must be a buffer config with a 'type', got {section!r:.80}")
        if isinstance(section['type'], str) and section['type'] in REFUSED_MEMBERS:
            raise ValueError(
                f"config key 'members.{name}.type' is {section['type']!r}: {REFUSED_MEMBERS[section['type']]}"
            )
        if section.get('distributed') is not None:
            raise ValueError(f"config key 'members.{name}.distributed': a member is a local buffer")
    out.members = EasyDict({name: _copied(section) for name, section in members.items()})
    out.weights = checked_weights(weights, list(members))
    if out.push_to is not None and out.push_to not in members:
        raise ValueError(f"config key 'push_to' is {out.push_to!r}; expected one of the members {list(members)}")
    return out


def checked_weights(weights: Any, names: List[str]) -> Any:
    """'size', or {member: weight} with every member named once, finite weights >= 0 and a positive sum."""
    if isinstance(weights, str) and weights == 'size':
        return weights
    if not isinstance(weights, Mapping) or set(weights) != set(names):
        raise ValueError(
            f"config key 'weights' must be 'size' or a dict with one weight per member {names}, got {weights!r:.80}"
        )
    for name, w in weights.items():
        if not (finite_number(w) and w >= 0):  # (an int beyond the float range too: 10**400)
            raise ValueError(f"config key 'weights.{name}' has value {w!r}; expected a finite number >= 0")
    if not sum(weights.values()) > 0:
        raise ValueError(f"config key 'weights' has no positive weight: {dict(weights)}")
    return {name: float(weights[name]) for name in names}


def shares(weights: np.ndarray) -> np.ndarray:
    """``weights`` (finite, >= 0, one positive) as fractions summing to 1, scaled by the largest first: weights near
    the float64 maximum (whose sum, or ``size *`` one, is inf) or tiny ones keep their exact ratios."""
    scaled = weights / weights.max()
    return scaled / scaled.sum()


def split_counts(size: int, weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """
    Overview:
        ``size`` split in proportion to ``weights``: each member gets ``floor(size * share)`` and the ``r`` items
        left go to ``r`` distinct members drawn by systematic sampling over the fractional parts, so a member is
        chosen with probability exactly its fractional part: every count is the floor or the ceiling of
        ``size * share`` and its mean is exactly ``size * share``.
    Examples:
        >>> split_counts(10, np.array([1.0, 1.0]), np.random.default_rng(0)).tolist()
        [5, 5]
    """
    exact = size * shares(weights)
    counts = np.floor(exact).astype(np.int64)
    left = size - int(counts.sum())
    if left:
        frac = exact - counts
        edges = np.cumsum(frac / frac.sum() * left)
        points = rng.random() + np.arange(left)
        counts += np.diff(np.concatenate([[0], np.searchsorted(points, edges, side='right')])).astype(np.int64)
    return counts


def concat(
    parts: Sequence[Any], key: str, names: Sequence[str], indices: Sequence[int], weighted: Optional[Sequence[bool]]
) -> Any:
    """One batch from the members' batches (in member order), each item marked with its member under ``key``: list
    storage gives new dicts (the stored items are not touched) with the member's name; tensor storage one dict of
    tensors with the member's index (a TensorDict when a member returns TensorDicts). A field only some members
    return is left out, except ``IS``, which is 1 for the items of a member that does not weight (``weighted``: which
    parts' members do, None when none of the mixture's does: then ``IS`` is a field like any other); a field the
    members return in shapes (or kinds) that do not join is a ``ValueError`` naming it."""
    if isinstance(parts[0], list):
        try:
            return [{**item, key: name} for part, name in zip(parts, names) for item in part]
        except TypeError as e:  # (an item pushed into a member itself: the mixture's push and loads refuse it)
            found = next(((n, x) for p, n in zip(parts, names) for x in p if not hasattr(x, 'keys')), None)
            if found is None:
                raise
            name, bad = found
            raise TypeError(f"member {name!r} holds a {type(bad).__name__} item; a mixture's items are dicts") from e
    tds = [p for p in parts if is_tensordict(p)]
    plain = [to_plain(p) if is_tensordict(p) else p for p in parts]
    if not all(isinstance(p, Mapping) for p in plain):
        raise TypeError(f"a mixture joins lists or dicts of tensors; a member returned {type(parts[0]).__name__}")
    out = _join(plain, names, weighted=weighted)
    out[key] = torch.cat([torch.full((_rows(p),), i, dtype=torch.int64) for p, i in zip(plain, indices)])
    return to_tensordict(out, tds[0].device) if tds else out


def _rows(batch: Mapping) -> int:
    value = next(iter(batch.values()))
    return _rows(value) if isinstance(value, Mapping) else len(value)


def _join(
    parts: Sequence[Mapping], names: Sequence[str], prefix: str = '', weighted: Optional[Sequence[bool]] = None
) -> Dict[str, Any]:
    out = {}
    for k in dict.fromkeys(k for p in parts for k in p):  # every member's fields, first seen first
        values = [p.get(k) for p in parts]
        if k == 'IS' and weighted is not None:  # (a field of that name a member holds itself is no weight)
            values = [v if w else None for v, w in zip(values, weighted)]
        if k == 'IS' and any(v is None for v in values):
            ref = next((v for v in values if v is not None), None)
            dtype = torch.float32 if ref is None else ref.dtype
            values = [torch.ones(_rows(p), dtype=dtype) if v is None else v for p, v in zip(parts, values)]
        if any(v is None for v in values):
            continue
        if all(isinstance(v, Mapping) for v in values):
            inner = _join(values, names, f'{prefix}{k}.')
            if inner:  # nested fields no member shares: left out, as a top-level one
                out[k] = inner
        elif all(isinstance(v, torch.Tensor) for v in values) and len({v.shape[1:] for v in values}) == 1:
            out[k] = torch.cat(values)
        elif not any(isinstance(v, (Mapping, torch.Tensor)) for v in values):
            out[k] = [x for v in values for x in v]
        else:
            got = {
                n: f'rows of shape {tuple(v.shape[1:])}' if isinstance(v, torch.Tensor) else type(v).__name__
                for n, v in zip(names, values)
            }
            raise ValueError(
                f"a mixture's members return field '{prefix}{k}' as {got}, which do not join into one batch; "
                f"expected every member to store it in one shape"
            )
    return out


_NAMED_ERRORS = (ValueError, TypeError, FileNotFoundError, PermissionError, ImportError)


def _raise_named(e: BaseException, member: str) -> NoReturn:
    """Raise ``e`` again with its message prefixed ``mixture member 'NAME': `` (its own type, e.g. a dataset's
    ``FileError``), or as it is where its type is not one of ``_NAMED_ERRORS`` or does not take one message."""
    named = None
    if isinstance(e, _NAMED_ERRORS):
        try:
            named = type(e)(f"mixture member {member!r}: {e}")
        except Exception:
            pass
    if named is None:
        raise e
    raise named from e


def _check_items(name: str, state: Any) -> None:
    """A member's saved list-storage items (or ``{'data': [...]}``) are dicts: every sampled item gets the member
    key (``ValueError`` naming the member and the item, before any member loads)."""
    if not isinstance(state, Mapping):
        return  # (the member refuses it, naming what it expected)
    storage = state.get('storage')
    listed = isinstance(storage, Mapping) and storage.get('kind') == 'list'
    items = storage.get('items') if listed else state.get('data')
    if not isinstance(items, list):
        return
    for i, item in enumerate(items):
        if not (isinstance(item, Mapping) or is_tensordict(item)):
            raise ValueError(
                f"state of member {name!r} holds item {i} of type {type(item).__name__}; a mixture's items are dicts "
                f"(every sampled item gets the member key)"
            )


def _check_storages(members: Mapping[str, IBuffer]) -> None:
    """The members' batches can be joined: one storage kind, and rewards summed over one n_step (a joined batch must
    not hold n-step returns beside one-step rewards)."""
    storages = {name: b.cfg.get('storage', {}).get('type', 'list') for name, b in members.items()}
    if len(set(storages.values())) > 1:
        raise ValueError(f"a mixture's members must use one storage kind, got storage.type {storages}")
    steps = {name: (b.cfg.get('storage', {}).get('frames') or {}).get('n_step', 1) for name, b in members.items()}
    if len(set(steps.values())) > 1:
        raise ValueError(
            "config key 'members.<name>.storage.frames.n_step' (1 without frames) must be the same for every "
            f"member: a batch joins their rewards and next observations; got {steps}"
        )


def _check_nesting(names: Sequence[str], schemas: Sequence[dict]) -> None:
    """A field every member returns, as rows in one and as a dict of fields in another, does not join (``_join``'s
    ``ValueError``, before any member draws)."""
    nodes = [{path[:i] for path in sc for i in range(1, len(path) + 1)} for sc in schemas]
    for node in sorted(set.intersection(*nodes), key=len):
        leaf = [node in sc for sc in schemas]
        if any(leaf) and not all(leaf):
            got = {n: f'rows of shape {tuple(sc[node][0])}' if node in sc else 'dict' for n, sc in zip(names, schemas)}
            raise ValueError(
                f"a mixture's members return field '{'.'.join(map(str, node))}' as {got}, which do not join into one "
                f"batch; expected every member to store it in one shape"
            )


class MemberLocks:
    """Several re-entrant locks as one (a mixture's members'): taken in order, released in reverse."""

    def __init__(self, locks: Sequence[Any]) -> None:
        self._locks = list(locks)

    def acquire(self, timeout: float = -1) -> bool:
        """Every lock, or none when ``timeout`` seconds (>= 0) passed first: False. An exception on the way (a Ctrl-C
        while it waits for a member) leaves none taken either."""
        deadline = None if timeout < 0 else time.monotonic() + timeout
        held = self.depths()
        try:
            for i, lock in enumerate(self._locks):
                if not lock.acquire(timeout=-1 if deadline is None else max(0.0, deadline - time.monotonic())):
                    for taken in reversed(self._locks[:i]):
                        taken.release()
                    return False
        except BaseException:
            self.release_to(held)
            raise
        return True

    def depths(self) -> List[int]:
        """How many times the calling thread holds each lock (``common.depth``)."""
        return [depth(lock) for lock in self._locks]

    def release_to(self, held: Sequence[int]) -> None:
        """``common.release_to`` for each lock, in reverse order."""
        for lock, n in reversed(list(zip(self._locks, held))):
            release_to(lock, n)

    def release(self) -> None:
        for lock in reversed(self._locks):
            lock.release()

    def __enter__(self) -> 'MemberLocks':
        held = self.depths()
        try:
            self.acquire()
        except BaseException:  # (one that came as ``acquire`` returned)
            self.release_to(held)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


@BUFFER_REGISTRY.register('mixture')
class MixtureReplayBuffer(IBuffer):
    """
    Overview:
        Named member buffers sampled together: ``sample(n)`` takes exact counts from each member in the ratio of
        ``weights`` (or of the members' sizes) and returns one batch, member by member in config order, each item
        marked with its member under ``member_key``. ``update`` routes priorities back to the member each item came
        from (by ``member_key``, or by the member's instance name in a list-storage ``replay_unique_id``), so
        prioritized members stay exact; each member's ``IS`` weights are its own. ``push`` / ``extend`` write to
        ``push_to`` (or ``member=``); ``state_dict`` / ``save_data`` hold every member.
    Interfaces:
        ``push``, ``extend``, ``sample``, ``update``, ``clear``, ``count``, ``stats``, ``state_dict``,
        ``load_state_dict``, ``save_data``, ``load_data``, ``start``, ``close``.
    Property:
        ``members`` (name -> buffer, read-only), ``member_names``, ``weights``, ``cfg``
    Thread-safety: the members lock themselves; the mixture's lock guards its RNG and counters, and is never held
        while a member waits (``sample(timeout=...)``), so pushes go on.
    Examples:
        >>> from ding_buffer import create_buffer
        >>> mix = create_buffer(dict(type='mixture', seed=0, weights=dict(offline=0.5, online=0.5),
        ...                          members=dict(offline=dict(type='naive', seed=1),
        ...                                       online=dict(type='advanced', seed=2))))
        >>> mix.push([{'obs': i} for i in range(100)], member='offline')
        100
        >>> mix.push([{'obs': -i} for i in range(1, 9)])  # push_to: the last member
        8
        >>> batch = mix.sample(6)
        >>> [item['mixture_member'] for item in batch]
        ['offline', 'offline', 'offline', 'online', 'online', 'online']
        >>> online = [item for item in batch if item['mixture_member'] == 'online']
        >>> mix.update({'replay_unique_id': [item['replay_unique_id'] for item in online],
        ...             'replay_buffer_idx': [item['replay_buffer_idx'] for item in online],
        ...             'priority': [3.0] * len(online)})
        {'updated': 3, 'stale': 0}
        >>> mix.close()
    """

    config = MIXTURE_CONFIG
    item_kind = 'transition'
    sample_kwargs = ('cur_learner_iter',)
    not_distributable = 'a mixture holds local member buffers; run each member as its own distributed buffer'

    def __init__(
        self,
        cfg: Optional[Mapping] = None,
        tb_logger: Any = None,
        exp_name: str = 'default_experiment',
        instance_name: str = 'buffer',
    ) -> None:
        check_instance_name(instance_name)
        self._cfg = mixture_config(cfg)
        self._instance_name = instance_name
        self._calls = CallMarks(instance_name)  # the calls that run the members' (and the user's) code, each thread's
        self._names = tuple(self._cfg.members)
        self._push_to = self._cfg.push_to or self._names[-1]
        self._key = self._cfg.member_key
        self._lock = forks.lock(reentrant=False)
        self._rng = new_rng(self._cfg.seed)
        if self._cfg.seed is None:
            forks.tell_children(self)
        self._counters = dict(sample_calls=0, refused_sample=0, **{f'sampled_{n}': 0 for n in self._names})
        self._closed = False
        members: Dict[str, IBuffer] = {}
        try:
            for name in self._names:
                try:
                    members[name] = create_buffer(
                        self._cfg.members[name],
                        tb_logger=tb_logger,
                        exp_name=exp_name,
                        instance_name=f'{instance_name}_{name}',
                    )
                except Exception as e:  # a config key, its dataset file: named with the member
                    _raise_named(e, name)
                kind = type(members[name]).capabilities()['item_kind']
                if kind != 'transition':
                    kinds = kind[:-1] + 'ies' if kind.endswith('y') else kind + 's'
                    raise ValueError(
                        f"config key 'members.{name}.type' is {self._cfg.members[name]['type']!r}, whose items are "
                        f"{kinds}; a mixture's members hold transitions"
                    )
            _check_storages(members)
        except BaseException:
            for b in members.values():
                b.close()
            raise
        self._members = members
        self._prioritized = {n for n, b in members.items() if isinstance(b, AdvancedReplayBuffer)}

    @classmethod
    def check_config(cls, section: Mapping) -> EasyDict:
        """The validated config, every member's section checked by its own type, without building anything (what a
        job checks before it starts)."""
        cfg = mixture_config(section)
        for name, member in cfg.members.items():
            check_section(get_buffer_cls(member), member, f'members.{name}.')
        return cfg

    # ------------------------------------------------------------------ properties
    @property
    def cfg(self) -> EasyDict:
        return self._cfg

    @property
    def members(self) -> Mapping[str, IBuffer]:
        """Member name -> buffer (read-only mapping): push to, load a dataset into or read one member directly."""
        return types.MappingProxyType(self._members)

    @property
    def member_names(self) -> tuple:
        """The members in config order: a tensor batch's ``member_key`` indexes this."""
        return self._names

    @property
    def weights(self) -> Any:
        """{member: weight} as configured (normalised to sum 1), or 'size'."""
        w = self._cfg.weights
        return w if w == 'size' else dict(zip(self._names, shares(np.array([w[n] for n in self._names])).tolist()))

    @property
    def member_key(self) -> str:
        """The field of a sampled item naming its member (config ``member_key``); an update carries it back."""
        return self._key

    @property
    def instance_name(self) -> str:
        return self._instance_name

    # ------------------------------------------------------------------ push
    def _member(self, member: Optional[str]) -> IBuffer:
        self._check_open()
        name = self._push_to if member is None else member
        if not isinstance(name, str) or name not in self._members:  # (a list or dict could not be looked up)
            raise ValueError(f"member must be one of {list(self._names)}, got {member!r:.60}")
        return self._members[name]

    def push(
        self, data: Any, cur_collector_envstep: int = -1, member: Optional[str] = None, batched: bool = False
    ) -> int:
        """Push to ``member`` (default: ``push_to``), as that member's ``push`` does; returns how many were stored."""
        self._calls.refuse('push')
        target = self._member(member)
        self._check_fields(data, target)
        if batched:
            return target.push(data, cur_collector_envstep, batched=True)
        return target.push(data, cur_collector_envstep)

    def extend(self, batch: Any, cur_collector_envstep: int = -1, member: Optional[str] = None) -> int:
        """``extend`` on ``member`` (default: ``push_to``)."""
        self._calls.refuse('extend')
        target = self._member(member)
        self._check_fields(batch, target)
        return target.extend(batch, cur_collector_envstep)

    def _check_fields(self, data: Any, target: IBuffer) -> None:
        """Pushed items are dicts (or TensorDicts) without a field named ``member_key``: every sampled item gets
        that field. Beside a prioritized member, a member without priorities takes no ``IS`` (its items' weights
        are 1 in a joined batch) and no ``replay_unique_id`` (an ``update`` by id would route it to the member it
        names)."""
        items = data if isinstance(data, list) else [data]
        for i, x in enumerate(items):
            if not (isinstance(x, Mapping) or is_tensordict(x)):
                raise TypeError(
                    f"a mixture stores dicts (every sampled item gets the field {self._key!r}); pushed item {i} is "
                    f"{type(x).__name__}"
                )
        if any(self._key in (x.keys() if is_tensordict(x) else x) for x in items):
            raise ValueError(
                f"pushed data has a field {self._key!r}, the mixture's member_key (config key 'member_key'), which "
                f"every sampled item gets; rename the field or the key"
            )
        if self._prioritized and not isinstance(target, AdvancedReplayBuffer):
            for key in ('IS', 'replay_unique_id'):
                if any(key in (x.keys() if is_tensordict(x) else x) for x in items):
                    name = next(n for n, b in self._members.items() if b is target)
                    why = 'a sample sets its IS weights to 1' if key == 'IS' else 'an update finds items by this id'
                    raise ValueError(
                        f"pushed data for member {name!r} has a field {key!r}, which a member without priorities may "
                        f"not hold beside prioritized members ({why}); drop or rename the field"
                    )

    # ------------------------------------------------------------------ sample
    @property
    def lock(self) -> 'MemberLocks':
        """Every member's re-entrant lock, taken in the order ``sample`` takes them: hold it (``with buffer.lock:``)
        around ``why_not_sample`` and ``sample`` to make them one step."""
        return MemberLocks([self._members[n].lock for n in self._names])

    def sample(self, size: int, cur_learner_iter: int = -1, timeout: Optional[float] = None) -> Optional[Any]:
        """
        Overview:
            ``size`` items: each member's exact share (see ``weights``) drawn by that member's own rules, joined in
            member order. All or nothing: every member with a share is asked first (``why_not_sample``, holding
            every member's lock until the draws are done), so ``None`` (each refusing member's reason logged) means
            no member drew anything; a member whose sampler or rule of the user's fails or refuses its draw leaves
            every member as it was. ``timeout``: seconds to wait in all for every member to be able to serve its
            share (``SampleTimeoutError`` if they are not).
        """
        return self._serve(size, cur_learner_iter, timeout, draw=True)

    def why_not_sample(self, size: int, cur_learner_iter: int = -1, timeout: Optional[float] = None) -> str:
        """Why ``sample(size, cur_learner_iter)`` would return None now (each refusing member's reason), or '' when
        every member would serve its share; nothing is drawn (the members' removal rules that are due run, as in a
        sample). ``timeout``: wait up to that many seconds (``SampleTimeoutError``). Hold ``lock`` around this call
        and the ``sample`` to make them one step."""
        return self._serve(size, cur_learner_iter, timeout, draw=False)

    def _serve(self, size: int, cur_learner_iter: int, timeout: Optional[float], draw: bool) -> Any:
        """The shares of ``size`` and, while every member with one can serve it (their locks held), the draws
        (``draw``) or '' (asked only: the split is drawn again by the sample). Otherwise, after waiting up to
        ``timeout`` seconds (then ``SampleTimeoutError``, nothing counted): the reason, or for a sample None, logged
        and counted in ``refused_sample``."""
        check_size(size)
        check_step(cur_learner_iter, 'cur_learner_iter')
        timeout = check_wait_timeout(timeout)
        self._check_open()
        self._calls.refuse('sample' if draw else 'why_not_sample')
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            locks = self.lock  # (a timeout bounds the wait for them too)
            left = None if deadline is None else max(LOCK_GRACE, deadline - time.monotonic())
            held, got, marking = locks.depths(), False, False
            try:
                got = locks.acquire(timeout=-1 if left is None else left)
                if not got:
                    raise SampleTimeoutError(
                        f"mixture: no sample of {size} within {timeout}s: another call held a member"
                    )
                marked = self._calls.mark('sample' if draw else 'why_not_sample')  # (the members' rules run below)
                marking = True
                with self._lock:
                    self._check_open()  # close() ends a wait
                    rng = self._rng  # (load_state_dict may replace it meanwhile: the state goes back to this one)
                    before, due = rng.bit_generator.state, self._reseed_due
                    if due:  # (a forked child's first draw)
                        self._reseed()
                    shares = self._shares(int(size))
                why = [] if shares is None else self._refusals(shares, cur_learner_iter)
                ready, out = shares is not None and not why, None
                try:
                    out = self._draw(shares, cur_learner_iter) if ready and draw else None
                finally:
                    if out is None:  # a refusal, a question or a failed draw: the split is not drawn either
                        with self._lock:
                            rng.bit_generator.state, self._reseed_due = before, due
                if ready:
                    return out if draw else ''
            finally:  # (the locks first: other threads wait for them)
                if got:
                    locks.release()
                else:  # (an exception -- a Ctrl-C -- as ``acquire`` returned)
                    locks.release_to(held)
                if marking:
                    self._calls.unmark(marked)
            reason = '; '.join(why) or 'every member is empty'
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise SampleTimeoutError(f"mixture: no sample of {size} within {timeout}s: {reason}")
            if left is None:
                return self._refused(reason) if draw else reason
            self._wait_ready(shares, cur_learner_iter, deadline)

    def _refused(self, reason: str) -> None:
        """A sample refused (without a timeout to wait for one): counted and logged."""
        with self._lock:
            self._counters['refused_sample'] += 1
        logging.getLogger(f'ding_buffer.{self._instance_name}').info(
            "[%s] refuse to sample: %s", self._instance_name, reason
        )

    def _may_fail(self, name: str) -> bool:
        return bool(getattr(self._members[name], 'sample_may_fail', True))

    def _draw(self, shares: List[tuple], cur_learner_iter: int) -> Optional[Any]:
        """Every share drawn (every member's lock held, each said it would draw): first the members whose sample may
        still fail or refuse once its draw began (a sampler or rule of the user's, deep copies of list items; each
        undoes its own failed draw), then the others, which cannot. So with one such member (the usual case) a
        failure or refusal leaves every member as it was; with several, the ones drawn before the failing one keep
        their draws (copying whole members on every sample to undo them would cost what the sample does many times
        over). None: a member refused."""
        self._check_joinable([name for _, name, _ in shares])
        parts: List[tuple] = []
        for i, name, k in sorted(shares, key=lambda s: not self._may_fail(s[1])):
            part = self._members[name].sample(k, cur_learner_iter)
            if part is None:
                with self._lock:
                    self._counters['refused_sample'] += 1
                return None
            parts.append((i, name, k, part))
        parts.sort(key=lambda p: p[0])
        with self._lock:
            self._counters['sample_calls'] += 1
            for _, name, k, _ in parts:
                self._counters[f'sampled_{name}'] += k
        names = [p[1] for p in parts]
        weighted = [n in self._prioritized for n in names] if self._prioritized else None
        return concat([p[3] for p in parts], self._key, names, [p[0] for p in parts], weighted)

    def _check_joinable(self, names: List[str]) -> None:
        """Before any member draws: the fields the members store in tensors (their storages' schemas) join into
        one batch -- the same shape, and dtypes torch can promote into one (``ValueError`` naming the field, as the
        join after the draws would, but with nothing drawn). Members without a schema (list storage) are joined
        as lists; a member's schema not known yet (empty) is checked by the join itself."""
        schemas = [getattr(getattr(self._members[n], 'storage', None), 'schema', None) for n in names]
        if len(names) < 2 or any(type(sc) is not dict for sc in schemas):
            return
        shared = set.intersection(*(set(sc) for sc in schemas))
        if any(len(sc) != len(shared) for sc in schemas):  # the members' fields differ: one a leaf, another a dict?
            _check_nesting(names, schemas)
        for path in shared:
            specs = [sc[path] for sc in schemas]
            shapes = {tuple(shape) for shape, _ in specs}
            try:
                dtype = specs[0][1]
                for _, other in specs[1:]:
                    dtype = torch.promote_types(dtype, other)
            except RuntimeError:
                dtype = None
            specs_of = list(zip(names, specs))
            if len(shapes) > 1 or dtype is None:  # (the join's own words; the dtypes when they are what differs)
                dtypes = len(shapes) == 1
                got = {n: f"rows of shape {tuple(sh)}" + (f', {dt}' if dtypes else '') for n, (sh, dt) in specs_of}
                raise ValueError(
                    f"a mixture's members return field '{'.'.join(map(str, path))}' as {got}, which do not join into "
                    f"one batch; expected every member to store it in one shape"
                    + (", in dtypes torch can join (it cannot promote uint16 / uint32 / uint64)" if dtypes else '')
                )

    def _shares(self, size: int) -> Optional[List[tuple]]:
        """``(member index, name, count)`` of every member with a share of ``size`` (None: no member holds an item
        under ``weights='size'``)."""
        sizes = np.array([self._members[n].count() for n in self._names], dtype=np.float64)
        w = sizes if self._cfg.weights == 'size' else np.array([self._cfg.weights[n] for n in self._names])
        if not w.sum() > 0:
            return None
        counts = split_counts(size, w, self._rng)
        return [(i, n, k) for i, (n, k) in enumerate(zip(self._names, counts.tolist())) if k]

    def _refusals(self, shares: List[tuple], cur_learner_iter: int) -> List[str]:
        """Each member's reason not to serve its share now (empty: every member would draw)."""
        why = [(n, self._members[n].why_not_sample(k, cur_learner_iter) or self._empty(n)) for _, n, k in shares]
        return [f'{n}: {w}' for n, w in why if w]

    def _empty(self, name: str) -> str:
        """'holds no item' for an empty member (a prioritized one draws with replacement: it tells only by
        drawing)."""
        return '' if self._members[name].count() else 'holds no item'

    def _wait_ready(self, shares: Optional[List[tuple]], cur_learner_iter: int, deadline: float) -> None:
        """Wait (holding no member's lock) until each member could serve its share, or the deadline; every member
        is empty under ``weights='size'``: a short pause."""
        if shares is None:
            time.sleep(min(0.01, max(0.0, deadline - time.monotonic())))
            return
        for _, name, k in shares:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            try:
                self._members[name].why_not_sample(k, cur_learner_iter, timeout=left)
            except SampleTimeoutError:
                return

    # ------------------------------------------------------------------ update
    def update(self, info: Any) -> Dict[str, int]:
        """
        Overview:
            Priorities back to the members their items came from: ``info`` is a prioritized update
            (``replay_unique_id``, ``replay_buffer_idx``, ``priority``) of items this mixture sampled, with their
            ``member_key`` (as sampled), or list-storage ids, which name their member. All or nothing: every
            member's part is checked before any member changes. Without ``priority``, or with no prioritized
            member, a no-op.
        Returns:
            - result (:obj:`dict`): ``{'updated': n, 'stale': m}`` summed over the members.
        """
        self._check_open()
        self._calls.refuse('update')
        if type(info) is not dict and is_tensordict(info):
            info = update_info(info)
        if not isinstance(info, Mapping):
            raise TypeError(f"update info must be a dict, got {type(info).__name__}")
        if info.get('priority') is None or not self._prioritized:
            return {'updated': 0, 'stale': 0}
        as_priorities(info['priority'])  # a bad entry is named by its place in this call, not in a member's part
        parts = self._route(info)
        for name, part in parts.items():  # check all: parse_update raises before anything changes
            if name in self._prioritized:
                member = self._members[name]
                parse_update(part, member.instance_name, member.replay_buffer_size)
        out = {'updated': 0, 'stale': 0}
        with self.lock:  # one step for every member: a close() that began meanwhile refuses it whole, or waits
            self._check_open()
            for name, part in parts.items():
                got = self._members[name].update(part) or {}
                for k in out:
                    out[k] += int(got.get(k, 0))
        return out

    def _route(self, info: Mapping) -> Dict[str, Dict[str, Any]]:
        """``info`` split by member: every per-item entry (as long as ``priority``) by the item's member."""
        n = len(np.asarray(as_numpy(info['priority'])).reshape(-1))
        where = self._where(info, n)
        parts = {}
        for i, name in enumerate(self._names):
            mask = where == i
            if mask.any():
                parts[name] = {k: _take(v, mask, n) for k, v in info.items() if k != self._key}
        return parts

    def _where(self, info: Mapping, n: int) -> np.ndarray:
        """Each entry's member (its index in ``member_names``)."""
        if self._key in info:
            raw = np.asarray(as_numpy(info[self._key]), dtype=object).reshape(-1)
            by_name = {name: i for i, name in enumerate(self._names)}
            where = np.empty(len(raw), dtype=np.int64)
            for j, v in enumerate(raw):
                if isinstance(v, str) and v in by_name:
                    where[j] = by_name[v]
                elif isinstance(v, (int, np.integer)) and not isinstance(v, bool) and 0 <= v < len(self._names):
                    where[j] = int(v)
                else:
                    raise ValueError(
                        f"update '{self._key}' holds {v!r:.40}; expected a member name or index of {list(self._names)}"
                    )
        else:
            ids = info.get('replay_unique_id')
            raw = [] if ids is None else list(np.asarray(as_numpy(ids), dtype=object).reshape(-1))
            by_prefix = {f'{self._instance_name}_{name}': i for i, name in enumerate(self._names)}
            if not raw or not all(isinstance(v, str) for v in raw):
                raise ValueError(
                    f"a mixture's update needs '{self._key}' (as sampled) to route int ids to their members; "
                    f"got keys {sorted(info)}"
                )
            where = np.array([by_prefix.get(v.rpartition('_')[0], -1) for v in raw], dtype=np.int64)
            if (where < 0).any():
                bad = raw[int(np.argmax(where < 0))]
                raise ValueError(f"update 'replay_unique_id' {bad!r:.60} is not an id of a member of this mixture")
        if len(where) != n:
            raise ValueError(f"update info lengths differ: priority {n}, member of each entry {len(where)}")
        return where

    # ------------------------------------------------------------------ the rest of IBuffer
    def clear(self) -> None:
        """Clear every member (as one step: every member's lock held)."""
        self._check_open()
        self._calls.refuse('clear')
        with self.lock:
            self._check_open()  # (a close() that began meanwhile: no member is cleared)
            for b in self._members.values():
                b.clear()

    def count(self) -> int:
        return sum(b.count() for b in self._members.values())

    def stats(self) -> Dict[str, float]:
        """``count``, the mixture's counters (``sampled_<member>``: items each member gave) and every member's stats
        as ``<member>.<stat>``."""
        with self._lock:
            out: Dict[str, float] = {'count': 0, **self._counters}
        for name, b in self._members.items():
            for k, v in b.stats().items():
                out[f'{name}.{k}'] = v
            out['count'] += out[f'{name}.count']
        return out

    def state_dict(self) -> Dict[str, Any]:
        with self.lock:  # one moment of every member
            with self._lock:
                if self._reseed_due:  # (a forked child's new seed, taken by whichever comes first: this or a draw)
                    self._reseed()
                own = {'rng': dict(self._rng.bit_generator.state), 'counters': dict(self._counters)}
            marked = self._calls.mark('state_dict')  # (the members' copies run the user's code)
            try:
                members = {n: b.state_dict() for n, b in self._members.items()}
            finally:
                self._calls.unmark(marked)
        return {'type': type(self).__name__, 'members': members, **own}

    def load_state_dict(self, state: Dict[str, Any], deepcopy: bool = False) -> None:
        """All or nothing: the envelope is checked first, then each member loads; if one refuses, the members
        already loaded get their previous state back (a copy of each is taken first). ``{'data': [...]}`` alone
        pushes the items to ``push_to``, as DI-engine's form does on every buffer."""
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a dict, got {type(state).__name__}")
        self._calls.refuse('load_state_dict')
        check_deepcopy(deepcopy)
        self._check_open()
        items = short_form(state)
        if items is not None:  # DI-engine's form: the items go to ``push_to``, as a push does
            self.push(copy.deepcopy(items) if deepcopy else items)
            return
        check_state_type(state, type(self).__name__)
        members, counters = state.get('members'), state.get('counters')
        if not isinstance(members, Mapping) or set(members) != set(self._names):
            got = sorted(members) if isinstance(members, Mapping) else type(members).__name__
            raise ValueError(f"state 'members' must hold exactly {list(self._names)}, got {got}")
        if not isinstance(counters, Mapping) or set(counters) != set(self._counters):
            raise ValueError(f"state 'counters' must hold {sorted(self._counters)}")
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 0 for v in counters.values()):
            raise ValueError("state 'counters' must be ints >= 0")
        rng = restored_rng(state)
        for name in self._names:
            _check_items(name, members[name])
        done: Dict[str, Dict[str, Any]] = {}
        with self.lock:  # every member's: a push meanwhile would be undone by a refused load's way back
            self._check_open()
            name = None
            try:
                for name in self._names:
                    before = self._members[name].state_dict()
                    self._members[name].load_state_dict(members[name], deepcopy=deepcopy)
                    done[name] = before
            except BaseException as e:
                for back, before in done.items():
                    self._members[back].load_state_dict(before)
                _raise_named(e, name)
            with self._lock:
                self._rng, self._counters = rng, {k: int(v) for k, v in counters.items()}
                self._reseed_due = False  # (a forked child's loaded RNG is what it draws from)

    def save_data(self, path: str) -> None:
        """Atomically write every member (and the mixture's RNG and counters) to ``path``."""
        save_state(path, type(self).__name__, self.state_dict())

    def load_data(self, path: str, allow_pickle: bool = False) -> None:
        """Restore a file written by ``save_data`` (all or nothing; ``allow_pickle`` as for the members)."""
        state = load_state(path, type(self).__name__, allow_pickle=allow_pickle)
        with restoring(path):
            self.load_state_dict(state)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"buffer '{self._instance_name}' is closed")

    def start(self) -> None:
        self._check_open()
        for b in self._members.values():
            b.start()

    def close(self) -> None:
        """Close every member (idempotent; the data stays readable through ``state_dict``)."""
        self._closed = True
        for b in self._members.values():
            b.close()

    def __repr__(self) -> str:
        inner = ', '.join(f'{n}={b!r}' for n, b in self._members.items())
        return f"MixtureReplayBuffer(instance_name={self._instance_name!r}, weights={self._cfg.weights!r}, {inner})"


def _take(value: Any, mask: np.ndarray, n: int) -> Any:
    """The entries of a per-item ``value`` (length ``n``) where ``mask``; anything else unchanged."""
    if isinstance(value, torch.Tensor) and value.dim() >= 1 and len(value) == n:
        return value[torch.from_numpy(mask)]
    if isinstance(value, np.ndarray) and value.ndim >= 1 and len(value) == n:
        return value[mask]
    if isinstance(value, (list, tuple)) and len(value) == n:
        return [v for v, m in zip(value, mask) if m]
    return value


__all__ = ['MixtureReplayBuffer', 'MIXTURE_CONFIG', 'split_counts']
