"""SIGINT / SIGTERM ask a training loop to stop at its next step, so it can write a final checkpoint.

    with StopSignals() as stop:
        while not done and not stop.requested:
            step()
    if stop.requested: checkpoint(); print how to resume; exit with stop.exit_code (130 / 143)

A second signal while the first is being honoured raises ``KeyboardInterrupt`` at once (a user pressing Ctrl-C
twice means it). Outside the main thread (signals cannot be caught there) it installs nothing and never requests.
The previous handlers come back on exit.
"""

import contextlib
import os
import shlex
import signal
import threading
from typing import Any, Dict, Iterator, List, Optional, Sequence

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# the `ding-buffer train` options a rank's or a resumed run's command line repeats (those given)
OVERRIDE_FLAGS = ('--seed', '--env-steps', '--device', '--iterations')


class StopSignals:
    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self._previous: Dict[int, Any] = {}
        self._holding = False

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def signame(self) -> Optional[str]:
        return None if self.signum is None else signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """The shell's convention for a process ended by a signal: 128 + its number."""
        return 0 if self.signum is None else 128 + int(self.signum)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None and not self._holding:
            raise KeyboardInterrupt
        self.signum = self.signum or signum

    def __enter__(self) -> 'StopSignals':
        if threading.current_thread() is threading.main_thread():
            for s in _SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """While the final checkpoint is written: a further signal is noted, not raised (a second Ctrl-C must
        not cut the checkpoint that the first one asked for)."""
        self._holding = True
        try:
            yield
        finally:
            self._holding = False

    def __exit__(self, *exc: Any) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()

    def report(self, args: Any, run_dir: str, where: str, resume: bool = True) -> int:
        """After a stopped run: print where it stopped and (``resume``) the command that resumes it (the same config
        and overrides, ``--resume run_dir``); return the exit code (0 when no signal came)."""
        if self.signum is None:
            return 0
        how = f"\nresume with: {resume_command(args, run_dir)}" if resume else ''
        print(
            f"\nstopped by {self.signame} at {where}; a checkpoint of that point is in "
            f"{os.path.join(run_dir, 'checkpoints')}{how}",
            flush=True,
        )
        return self.exit_code


@contextlib.contextmanager
def interrupting() -> Iterator[List[int]]:
    """Inside (main thread only), SIGINT and SIGTERM both raise ``KeyboardInterrupt``, and the yielded list gets the
    signal's number: a launcher waiting on its ranks passes that signal on to them and exits 128 + it (a SIGTERM's
    default action ended the launcher alone, its ranks going on as orphans)."""
    got: List[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return

    def handle(signum: int, frame: Any) -> None:
        got.append(signum)
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, handle) for s in _SIGNALS}
    try:
        yield got
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def resume_command(args: Any, run_dir: str) -> str:
    """``ding-buffer train ...`` continuing ``run_dir`` with the config and overrides of ``args`` (parsed
    ``ding-buffer train`` arguments)."""
    parts = ['ding-buffer', 'train', getattr(args, 'config_arg', None) or args.config]
    parts += override_argv(args, OVERRIDE_FLAGS + ('--nproc',))
    if args.threads != 1:
        parts += ['--threads', str(args.threads)]
    parts += ['--resume', run_dir]
    return ' '.join(shlex.quote(str(p)) for p in parts)


def override_argv(args: Any, flags: Sequence[str] = OVERRIDE_FLAGS) -> List[str]:
    """``[flag, value, ...]`` for each of ``flags`` that ``args`` (parsed ``ding-buffer train`` arguments) sets."""
    out = []
    for flag in flags:
        value = getattr(args, flag[2:].replace('-', '_'))
        if value is not None:
            out += [flag, str(value)]
    return out


__all__ = ['StopSignals', 'interrupting', 'resume_command']
