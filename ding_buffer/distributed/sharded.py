"""``ShardedBuffer``: K shards (each a manager's buffer, reached through a ``RemoteBuffer``, or a local buffer) used
as one buffer -- Reverb's client-side sharding, with sampling that equals one buffer holding every item.

Routing. A push goes to one shard: round-robin per call (``distributed.shard_route='round_robin'``), or by a
stable hash (CRC-32) of an item field (``'hash'`` with ``shard_key``: e.g. the environment id, so one episode's
items stay on one shard); a list or a batch is split by that hash, each shard receiving its rows in order.

Sampling ``sample(B)``. One ``stats()`` call per shard gives its size and, for the prioritized ``advanced`` type,
its total priority mass ``sum(p ** alpha)`` and smallest leaf. Then:

* ``advanced``: per-shard counts from a multinomial over the shards' masses, one stratified draw of that many
  items inside each shard (the shard's own ``sample``), and IS weights recomputed against the *global* smallest
  leaf, ``(p_i ** alpha / min_leaf) ** -beta``, with ``beta`` annealed here, per call, as one buffer anneals it.
  Each item is then drawn with probability ``p_i ** alpha / total`` -- exactly one prioritized buffer's rule.
* ``naive`` and uniform ``gfn``: without replacement, per-shard counts from a multivariate hypergeometric over the
  shards' sizes, then a draw without replacement inside each shard: a uniform draw of distinct items over all
  shards; with replacement a multinomial over sizes (``naive``: ``replace=False`` by default; ``gfn``: its
  ``sample_replacement`` rule, by default with replacement only when asking for more than all shards hold).
* ``gfn`` with ``prioritized_sampling`` (``softmax(log_reward)``): a multinomial over the shards'
  ``sum(exp(log_reward))`` (combined in log space), then a draw with replacement inside each shard. Successive
  sampling without replacement (Gumbel-top-k) does not split into per-shard counts: it is refused, by name.
  Keep-best capacity (``prioritized_capacity``) keeps the best items of each shard, not of all shards.

The batch carries a ``shard`` column (int64; in list storage a ``'shard'`` key on copies of the items) and is
shuffled, so it is not ordered by shard; ``update`` sends each row to the shard that owns it. This client applies
the minimum-size rule (``sample_min_limit_ratio``) to the total count, as one buffer would (the managers of a sharded
job keep their type's default rule); a shard owed more draws with replacement than it answers in one call -- its
capacity, or for ``advanced`` the items it holds (its own rule) -- answers in several calls, each the same draw law.

A shard that is gone makes the calls that need it raise ``ManagerUnavailableError`` naming the shard: pushes routed
elsewhere and the other shards' ``stats`` keep working; a sample needs every shard's mass, so it fails.
``state_dict`` / ``save_data`` keep one state (file) per shard (``path.shard<k>``) plus this client's beta and
routing position; ``load_state_dict`` and ``load_data`` are all or nothing (the shards loaded before a failing one
are put back: from copies of their states taken first, or, loading files into managers, from the state each manager
keeps until the client ends the load).
"""

import copy
import logging
import os
import zlib
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from .. import forks
from ..base import get_buffer_cls
from ..buffers.common import check_deepcopy, check_step, check_wait_timeout, restored_rng, short_form
from ..config import check_section
from ..control.priority import as_numpy, as_priorities, parse_update
from ..errors import ManagerUnavailableError
from ..persistence import file_path, load_state, refuse_unknown, save_state
from .frames_wire import frames_spec_of
from .sample_wait import poll_for_batch

SHARDABLE = ('naive', 'advanced', 'gfn')
ROUTES = ('round_robin', 'hash')


logger = logging.getLogger('ding_buffer.distributed')
_CLIENT_KEYS = ('type', 'num_shards', 'beta', 'next', 'rng')


def shard_path(path: str, k: int) -> str:
    """The file of shard ``k`` for ``save_data(path)`` / ``load_data(path)``."""
    return f'{file_path(path)}.shard{k}'


class ShardedBuffer:
    """
    Overview:
        ``shards`` used as one buffer of type ``cfg.type`` (see the module docstring). ``route`` / ``shard_key``:
        how pushes are spread; ``seed``: the RNG of the per-shard counts and the batch shuffle.
    Interfaces:
        ``push``, ``extend``, ``sample``, ``update``, ``count``, ``stats``, ``clear``, ``state_dict``,
        ``load_state_dict``, ``save_data``, ``load_data``, ``update_model_version``, ``set_model_version``,
        ``flush``, ``close``; ``shards`` (the shard buffers), ``num_shards``.
    """

    @staticmethod
    def check(cfg: Any, route: str = 'round_robin', shard_key: Optional[str] = None) -> None:
        """``ValueError`` naming the key when ``cfg`` / ``route`` / ``shard_key`` cannot be sharded (also called
        before any manager starts)."""
        kind = cfg.get('type')
        if kind not in SHARDABLE:
            raise ValueError(
                f"config key 'distributed.num_shards' > 1 works with types {list(SHARDABLE)}, got {kind!r}"
            )
        section = cfg.get('sampler')
        sampler = section.get('type') if isinstance(section, Mapping) else None  # (else: the shards' check names it)
        if sampler not in ((None, 'prioritized') if kind == 'advanced' else (None, 'uniform', 'python_random')):
            raise ValueError(
                f"config key 'sampler' ({sampler!r:.40}) with distributed.num_shards > 1: the shards are sampled as "
                "one buffer by their sizes (uniform) or priority masses (advanced); another sampler's draw does "
                "not split over shards"
            )
        if route not in ROUTES:
            raise ValueError(f"config key 'distributed.shard_route' must be one of {list(ROUTES)}, got {route!r:.40}")
        if route == 'hash' and not (isinstance(shard_key, str) and shard_key):
            raise ValueError(
                "config key 'distributed.shard_key' must name an item field for shard_route='hash', got "
                f"{shard_key!r:.40}"
            )
        spec = frames_spec_of(cfg)
        if spec is not None and (route != 'hash' or shard_key != spec['env_key'] or spec['env_key'] is None):
            raise ValueError(
                "config key 'storage.frames' with distributed.num_shards > 1 needs every environment's steps on one "
                "shard (each shard stores its own streams): set storage.frames.env_key, shard_route='hash' and "
                f"shard_key to that field; got env_key={spec['env_key']!r}, shard_route={route!r}, "
                f"shard_key={shard_key!r:.40}"
            )

    def __init__(
        self,
        shards: Sequence[Any],
        cfg: Any,
        route: str = 'round_robin',
        shard_key: Optional[str] = None,
        seed: Optional[int] = None,
    ) -> None:
        self.check(cfg, route, shard_key)
        if len(shards) < 1:
            raise ValueError("a sharded buffer needs at least one shard")
        kind = cfg.get('type')
        cfg = check_section(get_buffer_cls(cfg), cfg)  # with the type's defaults and key aliases, as a shard has them
        self.shards = list(shards)
        self.num_shards = len(self.shards)
        self.kind, self.route, self.shard_key = kind, route, shard_key
        self.prioritized = kind == 'advanced'
        self.softmax = kind == 'gfn' and bool(cfg.prioritized_sampling)
        self.gfn_replacement = cfg.sample_replacement if kind == 'gfn' else None
        self.capacity = int(cfg.replay_buffer_size)  # every shard's (a manager replies at most as many)
        self.alpha = float(cfg.get('alpha', 0.6))
        self.beta0 = float(cfg.get('beta', 0.4))
        self.anneal_step = int(cfg.get('anneal_step', 100_000) or 0)
        self.min_ratio = float(cfg.thruput_controller.sample_min_limit_ratio)
        self.beta = self.beta0
        self._next = 0  # round-robin position
        self._doubt: Optional[int] = None  # the shard of a round-robin push in doubt (its retry goes there)
        self._rng = forks.rng(seed)
        self._closed = False

    # ------------------------------------------------------------------ helpers
    def _call(self, k: int, name: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return getattr(self.shards[k], name)(*args, **kwargs)
        except ManagerUnavailableError as e:  # (its class kept: a ManagerTimeoutError stays one)
            raise type(e)(f"shard {k} of {self.num_shards} is unavailable ({name}): {e}") from e

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the sharded buffer is closed")

    def _hash(self, value: Any) -> int:
        """The shard of a ``shard_key`` value: the same for an int, a numpy int and a 0-dim tensor of it."""
        if isinstance(value, (torch.Tensor, np.ndarray, np.generic)):
            value = value.tolist()
        return zlib.crc32(repr(value).encode()) % self.num_shards

    # ------------------------------------------------------------------ push
    def push(self, data: Any, cur_collector_envstep: int = -1, batched: bool = False) -> int:
        """Route ``data`` (one item, a list, or with ``batched=True`` a dict of rows) and push it; the number stored."""
        self._check_open()
        if self.route == 'round_robin':
            return self._push_round_robin(data, cur_collector_envstep, batched)
        if batched or (self.kind == 'gfn' and isinstance(data, dict)):  # (a gfn buffer's dicts are batches)
            return self._push_batch_by_hash(data, cur_collector_envstep)
        items = data if isinstance(data, list) else [data]
        groups: Dict[int, List[Any]] = {}
        for i, item in enumerate(items):
            if not isinstance(item, dict) or self.shard_key not in item:
                raise ValueError(f"item {i} has no field {self.shard_key!r} (distributed.shard_key) to route it by")
            groups.setdefault(self._hash(item[self.shard_key]), []).append(item)
        return sum(self._call(k, 'push', group, cur_collector_envstep) for k, group in sorted(groups.items()))

    def _push_round_robin(self, data: Any, envstep: int, batched: bool) -> int:
        """The next shard, once the last one took its push: a push in doubt (``ManagerUnavailableError``) stays
        the shard's to retry (its ``RemoteBuffer`` tells the retry of a push it may hold, which must not reach
        another shard), any other push goes on to the next shard; a refused push changes nothing."""
        k, doubt = self._next, self._doubt
        if doubt is not None:
            pushes = getattr(self.shards[doubt], 'pushes', None)
            k = doubt if pushes is not None and pushes.is_retry(data, batched) else (doubt + 1) % self.num_shards
        try:
            n = self._call(k, 'push', data, envstep, batched=batched)
        except ManagerUnavailableError:
            self._next, self._doubt = k, k
            raise
        self._next, self._doubt = (k + 1) % self.num_shards, None
        return n

    def _push_batch_by_hash(self, batch: Any, envstep: int) -> int:
        if not isinstance(batch, dict) or self.shard_key not in batch:
            raise ValueError(f"a batched push needs a dict with the field {self.shard_key!r} (distributed.shard_key)")
        keys = batch[self.shard_key]
        lens = {k: _lead(v) for k, v in batch.items()}
        rows = lens[self.shard_key]
        if set(lens.values()) != {rows} or not rows:  # (as one buffer checks a batch: before any shard changes)
            raise ValueError(f"a batched push needs fields of one leading dimension > 0, got lengths {lens}")
        owner = np.array([self._hash(keys[i]) for i in range(rows)], dtype=np.int64)
        total = 0
        for k in np.unique(owner):
            idx = np.flatnonzero(owner == k)
            total += self._call(int(k), 'push', _take(batch, idx), envstep, batched=True)
        return total

    def extend(self, batch: Any, cur_collector_envstep: int = -1) -> int:
        return self.push(batch, cur_collector_envstep, batched=True)

    # ------------------------------------------------------------------ sample
    def sample(
        self,
        size: int,
        cur_learner_iter: int = -1,
        replace: Optional[bool] = None,
        timeout: Optional[float] = None,
        **kwargs: Any,
    ) -> Optional[Any]:
        """``size`` items drawn as one buffer holding every shard's items would draw them (module docstring);
        ``None`` while the shards hold too few items. With ``timeout`` (seconds) it asks again until a batch
        comes and raises ``SampleTimeoutError`` after it, as one ``RemoteBuffer`` does (each ask is one
        ``stats`` and one ``sample`` per shard, each bounded by ``distributed.timeout``)."""
        self._check_open()
        bad = sorted(kwargs)
        if bad:
            raise TypeError(f"a sharded sample takes cur_learner_iter, replace (naive, gfn) and timeout, not {bad}")
        _check_size(size)
        check_step(cur_learner_iter, 'cur_learner_iter')  # (before the split draws from the RNG)
        if replace is not None and (self.prioritized or type(replace) not in (bool, np.bool_)):
            raise TypeError("replace is a bool, for the naive and gfn types (prioritized draws are with replacement)")
        replace = None if replace is None else bool(replace)  # (sent to the shards as a plain bool)
        timeout = check_wait_timeout(timeout)  # before anything is asked: NaN or inf would poll forever
        if timeout is None:
            return self._sample_once(size, cur_learner_iter, replace)
        return poll_for_batch(
            lambda left: self._sample_once(size, cur_learner_iter, replace), size, timeout, 'sharded buffer'
        )

    def why_not_sample(self, size: int, cur_learner_iter: int = -1, timeout: Optional[float] = None) -> str:
        """Why ``sample(size)`` would return None now, by the shards' counts and priority mass (one ``stats`` per
        shard), or '' when it would draw -- a shard's own rule (staleness, use limits) may still refuse its part.
        ``timeout`` asks again until it is '' and raises ``SampleTimeoutError`` after it."""
        self._check_open()
        _check_size(size)
        check_step(cur_learner_iter, 'cur_learner_iter')
        timeout = check_wait_timeout(timeout)
        if timeout is None:
            return self._plan(size, None, draw=False)[0]
        ask = lambda left: None if self._plan(size, None, draw=False)[0] else ''  # noqa: E731
        return poll_for_batch(ask, size, timeout, 'sharded buffer')

    def _sample_once(self, size: int, cur_learner_iter: int, replace: Optional[bool]) -> Optional[Any]:
        why, stats, counts, draws, replace = self._plan(size, replace)
        if why:
            return None
        parts = []
        for k in np.flatnonzero(draws):
            kw = dict(cur_learner_iter=cur_learner_iter)
            if not self.prioritized:
                kw['replace'] = bool(replace)
            left = int(draws[k])
            # with replacement a shard may be owed more than one call answers: at most its capacity (a manager's
            # reply) and, prioritized, its own count (its minimum-size rule); several calls, each the same draw law
            step = max(1, int(counts[k])) if self.prioritized else left
            if self.capacity > 0:
                step = min(step, self.capacity)
            while left:
                part = self._call(int(k), 'sample', min(step, left), **kw)
                if part is None:  # the shard changed between its stats and its draw (a concurrent push / removal)
                    return None
                parts.append((int(k), part))
                left -= min(step, left)
        out = _concat(parts)
        if self.prioritized:
            min_leaf = min(float(s.get('priority_min_leaf', float('inf'))) for s in stats)
            self._reweight(out, min_leaf)
            self.beta = min(1.0, self.beta + (1.0 - self.beta0) / self.anneal_step) if self.anneal_step else self.beta
        return _take(out, self._rng.permutation(size))  # shuffled

    def _shard_stats(self) -> Tuple[List[Dict[str, Any]], np.ndarray]:
        """Every shard's ``stats()`` and item count; a shard that reports nonsense is named, not fed to numpy."""
        stats = [self._call(k, 'stats') for k in range(self.num_shards)]
        counts = np.array([int(s['count']) for s in stats], dtype=np.int64)
        for k, s in enumerate(stats):
            mass = s.get('priority_mass', 0.0)
            if counts[k] < 0 or not (isinstance(mass, (int, float)) and 0 <= mass < float('inf')):
                raise ValueError(
                    f"shard {k} of {self.num_shards} reports count {counts[k]} and priority mass "
                    f"{mass!r:.40}; expected a count >= 0 and a finite mass >= 0"
                )
        return stats, counts

    def _plan(self, size: int, replace: Optional[bool], draw: bool = True) -> Tuple[str, Any, Any, Any, Any]:
        """One ``stats`` per shard, then how many items each shard draws: ``(why, stats, counts, draws, replace)``,
        ``why`` the reason no draw can be made ('' when one can; then ``draws`` per shard, drawn with the buffer's
        RNG only when ``draw``)."""
        stats, counts = self._shard_stats()
        total = int(counts.sum())
        if total == 0 or total < self.min_ratio * size:
            why = f"the {self.num_shards} shards hold {total} items; sampling {size} needs {self.min_ratio * size:g}"
            return why, stats, counts, None, replace
        if self.prioritized:
            mass = np.array([float(s['priority_mass']) for s in stats])
            if not mass.sum() > 0:
                return f"the shards' {total} items have a priority mass of 0", stats, counts, None, replace
            draws = self._rng.multinomial(size, mass / mass.sum()) if draw else None
        elif self.softmax:
            rep = self.gfn_replacement if replace is None else replace
            if rep is False or (rep is None and size <= total):
                raise ValueError(
                    "a sharded gfn buffer with prioritized_sampling draws with replacement: pass "
                    "replace=True or set sample_replacement=True (softmax sampling without replacement "
                    "does not split into per-shard draws)"
                )
            lse = np.array([float(s.get('log_reward_logsumexp', float('-inf'))) for s in stats])
            if not np.isfinite(lse).any():  # every reward is 0: the limit of equal rewards, uniform
                w = counts / total
            else:
                w = np.exp(lse - lse[np.isfinite(lse)].max())
                w = w / w.sum()
            draws = self._rng.multinomial(size, w) if draw else None
            replace = True
        elif replace or (
            self.kind == 'gfn'
            and replace is None
            and (self.gfn_replacement or (self.gfn_replacement is None and size > total))
        ):
            draws = self._rng.multinomial(size, counts / total) if draw else None
            replace = True
        else:
            if total < size:
                why = f"the {self.num_shards} shards hold {total} items, fewer than {size} (drawn without replacement)"
                return why, stats, counts, None, replace
            self._check_one_reply(counts, size)
            draws = self._rng.multivariate_hypergeometric(counts, size) if draw else None
        return '', stats, counts, draws, replace

    def _check_one_reply(self, counts: np.ndarray, size: int) -> None:
        """A draw without replacement is one call a shard: ``ValueError`` when a shard could owe more items than one
        reply holds (its capacity; a gfn shard with lazy_sort holds up to twice it): calls of their own could
        repeat items."""
        over = np.flatnonzero(np.minimum(counts, size) > self.capacity)
        if len(over):
            k = int(over[0])
            raise ValueError(
                f"sample({size}) without replacement: shard {k} of {self.num_shards} holds {counts[k]} items, more "
                f"than one reply holds (replay_buffer_size={self.capacity}); sample at most {self.capacity} items, "
                "or with replacement"
            )

    def _reweight(self, out: Any, min_leaf: float) -> None:
        """IS weights against the global smallest leaf: ``(p ** alpha / min_leaf) ** -beta`` (one buffer's rule)."""
        if isinstance(out, dict):
            leaf = out['priority'].double() ** self.alpha
            out['IS'] = (leaf / min_leaf).pow(-self.beta).to(out['IS'].dtype)
        else:
            for item in out:
                item['IS'] = float((float(item['priority']) ** self.alpha / min_leaf) ** -self.beta)

    # ------------------------------------------------------------------ update
    def update(self, info: Dict[str, Any]) -> Optional[Dict[str, int]]:
        """Send each row of ``info`` to the shard that owns it (its ``shard`` column, from ``sample``)."""
        self._check_open()
        if not isinstance(info, dict) or 'shard' not in info:
            raise ValueError(
                "update of a sharded buffer needs the 'shard' column of the sampled batch (with "
                "'replay_unique_id', 'replay_buffer_idx' and 'priority')"
            )
        shard = np.asarray(as_numpy(info['shard'])).reshape(-1)
        if len(shard) and shard.dtype.kind not in 'iu':
            raise TypeError(f"'shard' must be ints (the sampled batch's column), got dtype {shard.dtype}")
        shard = shard.astype(np.int64, copy=False)
        if shard.size and (shard.min() < 0 or shard.max() >= self.num_shards):
            raise ValueError(
                f"'shard' holds {int(shard.min())}..{int(shard.max())}; there are {self.num_shards} shards"
            )
        # checked whole first, as one buffer checks it: a bad row in a later shard's part changed the shards before
        # it (errors name places in this call, not in a shard's part)
        for key, value in info.items():
            if isinstance(value, (torch.Tensor, np.ndarray, list, tuple)):  # (rows of one shard go to it)
                n = len(value) if isinstance(value, (list, tuple)) or value.ndim else 'a scalar'
                if n != len(shard):
                    raise ValueError(f"update info lengths differ: shard {len(shard)}, {key} {n}")
        if self.prioritized:
            parse_update({k: v for k, v in info.items() if k != 'shard'}, '', self.capacity)
        elif info.get('priority') is not None:
            as_priorities(info['priority'])
        total = {'updated': 0, 'stale': 0}
        for k in np.unique(shard):
            idx = np.flatnonzero(shard == k)
            sub = {key: _rows(value, idx) for key, value in info.items() if key != 'shard'}
            res = self._call(int(k), 'update', sub) or {}
            for key in total:
                total[key] += int(res.get(key, 0))
        return total

    # ------------------------------------------------------------------ the rest of the IBuffer surface
    def count(self) -> int:
        return sum(int(self._call(k, 'count')) for k in range(self.num_shards))

    def __len__(self) -> int:
        return self.count()

    def stats(self) -> Dict[str, Any]:
        """Every shard's ``stats()`` as ``shard<k>/<key>``, plus the sums of ``count`` and the push / sample
        counters, ``num_shards`` and this client's ``beta``."""
        out: Dict[str, Any] = {'num_shards': self.num_shards}
        for k in range(self.num_shards):
            for key, value in self._call(k, 'stats').items():
                out[f'shard{k}/{key}'] = value
                if key in ('count', 'push_items', 'sampled_items', 'remove_count', 'updated', 'stale_updates'):
                    out[key] = out.get(key, 0) + value
        if self.prioritized:
            out['beta'] = self.beta
        return out

    def clear(self) -> None:
        for k in range(self.num_shards):
            self._call(k, 'clear')

    def state_dict(self) -> Dict[str, Any]:
        return {**self._client_state(), 'shards': [self._call(k, 'state_dict') for k in range(self.num_shards)]}

    def _client_part(self, state: Any, keys: Tuple[str, ...]) -> Tuple[float, int, Any]:
        """The client's own part of a sharded state (``beta``, the routing position ``next``, the RNG), checked
        whole before anything changes: ``ValueError`` naming the key."""
        if not isinstance(state, dict) or state.get('type') != 'ShardedBuffer':
            raise ValueError("not a sharded buffer's state (state_dict() of a ShardedBuffer)")
        refuse_unknown(state, keys, "a sharded buffer's state")
        missing = [k for k in keys if k not in state]
        if missing:
            raise ValueError(f"a sharded buffer's state lacks key(s) {missing}")
        if state['num_shards'] != self.num_shards:
            raise ValueError(f"the state holds {state['num_shards']!r} shards, this buffer has {self.num_shards}")
        beta, nxt = state['beta'], state['next']
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0 <= beta <= 1:
            raise ValueError(f"state key 'beta' is {beta!r:.40}; expected a number in [0, 1]")
        if isinstance(nxt, bool) or not isinstance(nxt, int) or not 0 <= nxt < self.num_shards:
            raise ValueError(f"state key 'next' is {nxt!r:.40}; expected an int in [0, {self.num_shards})")
        try:
            return float(beta), nxt, restored_rng(state)
        except ValueError as e:
            raise ValueError(f"state key 'rng' is not the state of numpy's default generator: {e}") from e

    def load_state_dict(self, state: Dict[str, Any], deepcopy: bool = False) -> None:
        """All or nothing: a shard that refuses its state puts the shards loaded before it back. ``{'data': [...]}``
        alone pushes the items, as DI-engine's form does on every buffer."""
        check_deepcopy(deepcopy)
        items = short_form(state) if isinstance(state, Mapping) else None
        if items is not None:
            self.push(copy.deepcopy(items) if deepcopy else items)
            return
        beta, nxt, rng = self._client_part(state, _CLIENT_KEYS + ('shards',))
        if not isinstance(state['shards'], (list, tuple)) or len(state['shards']) != self.num_shards:
            raise ValueError(f"state key 'shards' must hold {self.num_shards} shard states")
        before = [self._call(k, 'state_dict') for k in range(self.num_shards)]
        done = 0
        try:
            for k, sub in enumerate(state['shards']):
                self._call(k, 'load_state_dict', sub, deepcopy=deepcopy)
                done += 1
        except BaseException:
            for k in range(done):
                self._call(k, 'load_state_dict', before[k])
            raise
        self.beta, self._next, self._rng, self._doubt = beta, nxt, rng, None

    def save_data(self, path: str) -> List[Any]:
        """Each shard writes ``path.shard<k>`` (remote shards: inside their manager's ``file_root``); with local
        shards this client writes its own part (routing position, beta, RNG) next to them, to ``path.client``.
        Returns what each shard wrote."""
        out = [self._call(k, 'save_data', shard_path(path, k)) for k in range(self.num_shards)]
        if self._local:
            save_state(f'{file_path(path)}.client', 'ShardedBuffer', self._client_state())
        return out

    @property
    def _local(self) -> bool:
        """Whether every shard is a buffer in this process (a remote one is a manager's: it has ``end_load``)."""
        return not any(hasattr(shard, 'end_load') for shard in self.shards)

    def _client_state(self) -> Dict[str, Any]:
        """The client's own part of ``state_dict()``: what ``path.client`` holds."""
        return {
            'type': 'ShardedBuffer',
            'num_shards': self.num_shards,
            'beta': self.beta,
            'next': self._next,
            'rng': copy.deepcopy(self._rng.bit_generator.state),
        }

    def load_data(self, path: str, allow_pickle: bool = False) -> List[Any]:
        """Each shard loads ``path.shard<k>`` (a remote shard's manager decides on pickle itself); all or nothing,
        as ``load_state_dict``: a shard that refuses its file puts the shards loaded before it back -- a remote one
        from the state its manager kept (nothing crosses the wire), a local one from a copy taken first. Local
        shards: this client's own part comes back from ``path.client`` (checked before any shard loads)."""
        client, own = f'{file_path(path)}.client', None
        if self._local and os.path.exists(client):
            own = self._client_part(load_state(client, 'ShardedBuffer'), _CLIENT_KEYS)
        elif self._local:  # a save of an older version: the shards load, this client's part stays
            logger.warning("%s not found: the routing position, beta and RNG of this client stay as they are", client)
        done: List[Tuple[int, Any]] = []  # (shard, its state before the load: None where its manager keeps it)
        out = []
        try:
            for k, shard in enumerate(self.shards):
                where = shard_path(path, k)
                if hasattr(shard, 'end_load'):  # a manager's: it keeps its own state until end_load
                    done.append((k, None))  # (first: a load whose reply was lost may have happened)
                    out.append(self._call(k, 'load_data', where, allow_pickle=allow_pickle, undo=True))
                else:  # a local buffer's own load is all or nothing: a copy of its state for the others' failure
                    before = shard.state_dict()
                    out.append(self._call(k, 'load_data', where, allow_pickle=allow_pickle))
                    done.append((k, before))
        except BaseException:
            for k, before in done:
                self._end(k, before, restore=True)
            raise
        for k, before in done:
            if before is None:
                self._end(k, None, restore=False)
        if own is not None:
            self.beta, self._next, self._rng = own
        self._doubt = None
        return out

    def _end(self, k: int, before: Any, restore: bool) -> None:
        """End shard ``k``'s part of a load: put its state back (``restore``) or let its manager drop the copy it
        kept; a manager that does not answer keeps what it has (it drops a kept copy when it counts this client
        lost or at its exit)."""
        try:
            if before is None:
                self._call(k, 'end_load', restore)
            elif restore:
                self._call(k, 'load_state_dict', before)
        except ManagerUnavailableError:
            if before is not None:
                raise

    def update_model_version(self, version: int, session_id: Optional[str] = None) -> List[Any]:
        return [self._call(k, 'update_model_version', version, session_id) for k in range(self.num_shards)]

    def set_model_version(self, version: int, session_id: Optional[str] = None) -> None:
        for shard in self.shards:
            shard.set_model_version(version, session_id)

    def flush(self) -> None:
        for k in range(self.num_shards):
            if hasattr(self.shards[k], 'flush'):
                self._call(k, 'flush')

    def start(self) -> None:
        for shard in self.shards:
            shard.start()

    def close(self, timeout: Optional[float] = None) -> None:
        """Close every shard's client (each one's errors are collected; the first is raised after all closed)."""
        if self._closed:
            return
        self._closed = True
        failed = []
        for k, shard in enumerate(self.shards):
            try:
                shard.close() if timeout is None else shard.close(timeout=timeout)
            except Exception as e:  # every shard gets its close; the failures are reported together
                failed.append((k, e))
        if failed:
            k, e = failed[0]
            where = ', '.join(str(i) for i, _ in failed)
            raise (ManagerUnavailableError if isinstance(e, ManagerUnavailableError) else RuntimeError)(
                f"closing shard{'s' if len(failed) > 1 else ''} {where} of {self.num_shards} failed (the others "
                f"closed): {e}"
            ) from e

    def __enter__(self) -> 'ShardedBuffer':
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __iter__(self) -> Any:
        raise TypeError("ShardedBuffer is not iterable: draw batches with buffer.sample(batch_size) in a loop")


# ---------------------------------------------------------------------------------------------- batch helpers
def _rows(value: Any, idx: np.ndarray) -> Any:
    """Rows ``idx`` of a per-row field (tensor, array, list) of an update dict; other values as they are."""
    if isinstance(value, torch.Tensor):
        return value[torch.from_numpy(idx)]
    if isinstance(value, np.ndarray):
        return value[idx]
    if isinstance(value, (list, tuple)):
        return [value[i] for i in idx]
    return value


def _take(batch: Any, idx: np.ndarray) -> Any:
    """Rows ``idx`` of a batch: of every field of a (nested) dict, or of a list of items."""
    if isinstance(batch, dict):
        return {k: _take(v, idx) for k, v in batch.items()}
    return _rows(batch, idx)


def _check_size(size: Any) -> None:
    if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or size <= 0:
        raise ValueError(f"sample size must be an int > 0, got {size!r:.40}")


def _concat(parts: List[Any]) -> Any:
    """Shard batches as one: dicts of tensors concatenated leaf by leaf with a ``shard`` column; lists of items
    as copies with a ``shard`` key."""
    first = parts[0][1]
    if isinstance(first, list):
        return [dict(item, shard=k) for k, part in parts for item in part]
    out = _cat([p for _, p in parts])
    out['shard'] = torch.cat([torch.full((_lead(p),), k, dtype=torch.int64) for k, p in parts])
    return out


def _cat(batches: List[Any]) -> Any:
    if isinstance(batches[0], dict):
        return {k: _cat([b[k] for b in batches]) for k in batches[0]}
    if isinstance(batches[0], torch.Tensor):
        return torch.cat(batches)
    if isinstance(batches[0], np.ndarray):
        return np.concatenate(batches)
    return [x for b in batches for x in b]


def _lead(value: Any) -> Optional[int]:
    """The leading dimension of a batched field (a nested dict's: its leaves', when they agree); None for a 0-dim
    one, or leaves that disagree."""
    if isinstance(value, dict):
        leads = {_lead(v) for v in value.values()}
        return leads.pop() if len(leads) == 1 else None
    return len(value) if hasattr(value, '__len__') and getattr(value, 'ndim', 1) else None


__all__ = ['ShardedBuffer', 'shard_path', 'SHARDABLE', 'ROUTES']
