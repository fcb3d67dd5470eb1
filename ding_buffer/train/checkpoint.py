"""Crash-safe checkpoint directories: written under a temporary name, completed with a marker, published by an
atomic rename. A process killed at any moment (SIGKILL included, also in the middle of a write) leaves either
the previous checkpoints or the new one -- never an unloadable "latest".

Layout: ``<dir>/step_000010000/{trainer.pt, buffer.pt, COMPLETE}``; temporaries are ``<dir>/.tmp-...`` and are
ignored (and removed) by the next save or load.
"""

import os
import shutil
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..persistence import atomic_json, atomic_save, fsync_dir, out_of_memory

MARKER = 'COMPLETE'


def save_checkpoint(
    root: str,
    step: int,
    trainer_state: Dict[str, Any],
    save_buffer: Callable[[str], None],
    keep: int,
) -> str:
    """
    Overview:
        Write ``trainer_state`` (``torch.save``) and the buffer (``save_buffer(path)``) into a temporary directory,
        fsync, write the ``COMPLETE`` marker, rename to ``step_<step>`` and keep only the newest ``keep``.
    Returns:
        - path (:obj:`str`): the published checkpoint directory.
    """
    os.makedirs(root, exist_ok=True)
    _remove_temporaries(root)
    final = os.path.join(root, f'step_{step:09d}')
    if os.path.isfile(os.path.join(final, MARKER)):
        # Same step already saved (e.g. resuming a finished run): no env step happened since, so keep it --
        # replacing it would need a delete-then-rename window in which a kill could lose the only copy.
        return final
    tmp = os.path.join(root, f'.tmp-step_{step:09d}-{os.getpid()}')
    os.makedirs(tmp)
    atomic_save(trainer_state, os.path.join(tmp, 'trainer.pt'))
    save_buffer(os.path.join(tmp, 'buffer.pt'))  # atomic + fsynced by the buffer itself
    atomic_json({'step': step}, os.path.join(tmp, MARKER))  # (fsyncs tmp, with the two files above)
    if os.path.exists(final):  # an unmarked leftover of the same name cannot be a loadable checkpoint
        shutil.rmtree(final)
    os.rename(tmp, final)
    fsync_dir(root)
    for old in complete_checkpoints(root)[:-keep]:
        shutil.rmtree(old[1], ignore_errors=True)
    return final


def complete_checkpoints(root: str) -> List[Tuple[int, str]]:
    """(step, path) of every published checkpoint with its marker, oldest first."""
    if not os.path.isdir(root):
        return []
    out = []
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if name.startswith('step_') and os.path.isfile(os.path.join(path, MARKER)):
            try:
                out.append((int(name[len('step_') :]), path))
            except ValueError:
                continue
    return sorted(out)


def check_checkpoints(run_dir: str, resume: bool) -> None:
    """``ValueError`` unless ``run_dir/checkpoints`` holds a complete checkpoint when resuming, and none otherwise
    (a new run must not mix with an old one: ``--resume`` continues it)."""
    ckpt_dir = os.path.join(run_dir, 'checkpoints')
    done = complete_checkpoints(ckpt_dir)
    if resume and not done:
        raise ValueError(f"--resume {run_dir}: no complete checkpoint in {ckpt_dir}")
    if not resume and done:
        raise ValueError(
            f"run directory '{run_dir}' already holds checkpoints: continue it with --resume {run_dir}, "
            "or pick another exp_name / seed / log_dir"
        )


def load_latest(root: str, load: Callable[[str], Any]) -> Tuple[Optional[str], Any]:
    """
    Overview:
        Call ``load(path)`` on the newest complete checkpoint; if it fails (a damaged file), fall back to the
        previous one. ``(None, None)`` when there is none. Leftover temporaries are removed.
    """
    _remove_temporaries(root)
    errors, damaged = [], []
    for _, path in reversed(complete_checkpoints(root)):
        try:
            loaded = load(path)
        except Exception as e:  # any damage (truncated, empty, foreign file): try the previous checkpoint
            if out_of_memory(e):  # not damage: the newest checkpoint stays the one to resume from
                raise
            errors.append(f"{path}: {type(e).__name__}: {' '.join(str(e).split())}")  # (one line: torch's are not)
            damaged.append(path)
            continue
        for bad in damaged:  # newer than one that loads: damaged. Set aside (kept to inspect), so that the
            # resumed run publishes its own checkpoint of that step instead of keeping the damaged one
            aside = os.path.join(root, 'damaged-' + os.path.basename(bad))
            shutil.rmtree(aside, ignore_errors=True)  # (set aside before, at an earlier fallback)
            os.rename(bad, aside)
        if damaged:
            fsync_dir(root)
        return path, loaded
    if errors:
        raise ValueError("no loadable checkpoint in '{}': {}".format(root, '; '.join(errors)))
    return None, None


def _remove_temporaries(root: str) -> None:
    if os.path.isdir(root):
        for name in os.listdir(root):
            if name.startswith('.tmp-'):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def purge_tensorboard(writer: Any, step: int) -> None:
    """Make TensorBoard hide what a stopped run logged at ``step`` and after (the resumed run logs it again): the
    session-start event ``SummaryWriter(purge_step=step)`` writes, for a writer already open. Call it before the
    resumed run writes anything; every tag's step must be at most the run's own (here: the training step)."""
    from tensorboard.compat.proto.event_pb2 import Event, SessionLog

    writer.file_writer.add_event(Event(step=step, session_log=SessionLog(status=SessionLog.START)))
