"""Two-rank transport scenarios (launched by tests/distributed/test_distributed_faults.py).

late_receiver: rank 0 sends 256 KiB of 0xAB with a 1 s deadline while rank 1 does not read yet (above Open
MPI's shared-memory eager limit and gloo's rendezvous, so the send cannot complete); the send must raise
``SendTimeout`` and keep the frame alive. Rank 0 then scribbles 0xCD over fresh memory and queues a second
message. Rank 1 starts reading after 3 s and must get exactly the 0xAB bytes, then the second message.

stranger (MPI, four ranks): rank 3 reads ranks 0 and 1, which send it small and large frames interleaved (small
ones are read on its dispatcher, large ones handed to the peer's own thread); rank 2, not one of its peers,
sends it a raw message. Every frame must arrive whole and in order per sender, and the stranger's message be
dropped as a protocol error.

frozen_head (MPI, three ranks, no single-copy shared memory: as across hosts, a message past the eager size
needs its sender to move on): rank 0 starts sending a 120 KiB frame to rank 2 and freezes itself (SIGSTOP);
rank 1 sends 20 small frames meanwhile, which rank 2 must read; rank 2 then thaws rank 0, whose frame arrives.
"""

import json
import os
import sys
import time
import traceback

import numpy as np
import torch

SCENARIO, BACKEND, OUT = sys.argv[1], sys.argv[2], sys.argv[3]
RESULT = {}


def main() -> None:
    from ding_buffer.distributed.frame_reader import MESSAGE
    from ding_buffer.distributed.peer_transports import MPITransport, TorchTransport
    from ding_buffer.distributed.startup import init_mpi, init_torch
    from ding_buffer.errors import SendTimeout

    rank, _ = init_torch(60.0) if BACKEND == 'torch' else init_mpi()
    RESULT['rank'] = rank
    if SCENARIO == 'stranger':
        return stranger(rank)
    if SCENARIO == 'frozen_head':
        return frozen_head(rank)
    T = TorchTransport if BACKEND == 'torch' else MPITransport
    t = T([1 - rank], False, 1 << 30, grace=20.0)
    if rank == 0:
        t.start()
        payload = {'x': torch.full((256 << 10,), 0xAB, dtype=torch.uint8)}
        start = time.monotonic()
        try:
            t.send(1, payload, deadline=time.monotonic() + 1.0)
            RESULT['timed_out'] = False
        except SendTimeout as e:
            RESULT['timed_out'], RESULT['error'] = True, type(e).__name__
        RESULT['timeout_seconds'] = time.monotonic() - start
        del payload
        junk = [np.full(256 << 10, 0xCD, np.uint8) for _ in range(64)]  # reuse of freed memory would show up
        t.send(1, {'y': 'after'}, deadline=time.monotonic() + 30)
        RESULT['junk'] = len(junk)
    else:
        time.sleep(3.0)
        t.start()
        _, kind, first = t.recv(30)
        x = first['x']
        RESULT['first_ok'] = bool(kind == MESSAGE and (x == 0xAB).all())
        RESULT['first_len'] = int(x.numel())
        _, kind, second = t.recv(30)
        RESULT['second'] = second.get('y')
    RESULT['stuck'] = t.close(20)
    RESULT['ok'] = True


STRANGER_FRAMES = 40  # per sender; every 8th carries a 1 MiB part


def stranger(rank: int) -> None:
    from mpi4py import MPI

    from ding_buffer.distributed.frame_reader import MESSAGE
    from ding_buffer.distributed.framing import TAG
    from ding_buffer.distributed.peer_transports import MPITransport

    if rank == 2:  # not a peer of rank 3: its message must be dropped
        MPI.COMM_WORLD.Send([np.full(128, 7, np.uint8), MPI.BYTE], dest=3, tag=TAG)
        MPI.COMM_WORLD.Barrier()
        RESULT['ok'] = True
        return
    if rank in (0, 1):
        t = MPITransport([3], False, 1 << 30, grace=20.0)
        t.start()
        for i in range(STRANGER_FRAMES):
            big = i % 8 == 3
            x = torch.full((1 << 20,) if big else (16,), rank * 100 + i % 100, dtype=torch.uint8)
            t.send(3, {'from': rank, 'seq': i, 'x': x}, deadline=time.monotonic() + 30)
        MPI.COMM_WORLD.Barrier()
        RESULT['stuck'] = t.close(20)
        RESULT['ok'] = True
        return
    t = MPITransport([0, 1], False, 1 << 30, grace=20.0)
    t.start()
    got = {0: [], 1: []}
    whole = True
    end = time.monotonic() + 60
    while len(got[0]) + len(got[1]) < 2 * STRANGER_FRAMES and time.monotonic() < end:
        item = t.recv(1.0)
        if item is None or item[1] != MESSAGE:
            continue
        peer, _, m = item
        got[peer].append(m['seq'])
        n = (1 << 20) if m['seq'] % 8 == 3 else 16
        whole &= m['from'] == peer and m['x'].numel() == n and bool((m['x'] == peer * 100 + m['seq'] % 100).all())
    MPI.COMM_WORLD.Barrier()
    RESULT['seqs'] = got
    RESULT['whole'] = whole
    RESULT['protocol_errors'] = t.protocol_errors
    RESULT['stuck'] = t.close(20)
    RESULT['ok'] = True


def frozen_head(rank: int) -> None:
    import signal

    from mpi4py import MPI

    from ding_buffer.distributed import framing as fr
    from ding_buffer.distributed.codec import encode
    from ding_buffer.distributed.frame_reader import MESSAGE
    from ding_buffer.distributed.peer_transports import MPITransport

    comm = MPI.COMM_WORLD
    flag = lambda name: open(os.path.join(OUT, name), 'w').close()  # noqa: E731
    has = lambda name: os.path.exists(os.path.join(OUT, name))  # noqa: E731
    if rank == 0:  # a raw sender: the head of a whole frame, then frozen mid-send
        header, parts = encode({'op': 'count', 'id': 1, 'pad': np.full(120 << 10, 5, np.uint8)})
        head, extra, out, _ = fr.frame(header, parts, 1)
        assert extra is None and not out and len(head) > 64 << 10
        with open(os.path.join(OUT, 'rank0.pid'), 'w') as f:
            f.write(str(os.getpid()))
        req = comm.Isend([head, MPI.BYTE], dest=2, tag=fr.TAG)
        flag('frozen')
        os.kill(os.getpid(), signal.SIGSTOP)
        end = time.monotonic() + 30
        while not req.Test() and time.monotonic() < end:
            time.sleep(0.001)
        RESULT['sent'] = bool(req.Test())
    elif rank == 1:  # an honest sender
        t = MPITransport([2], False, 1 << 30, grace=10.0)
        t.start()
        end = time.monotonic() + 30
        while not has('frozen') and time.monotonic() < end:
            time.sleep(0.01)
        time.sleep(0.3)
        for i in range(20):
            t.send(2, {'seq': i}, deadline=time.monotonic() + 10)
        RESULT['stuck'] = t.close(10)
    else:
        t = MPITransport([0, 1], False, 1 << 30, grace=2.0)
        t.start()
        seqs, from0 = [], None
        end = time.monotonic() + 15
        while len(seqs) < 20 and time.monotonic() < end:
            item = t.recv(0.5)
            if item is not None and item[0] == 1 and item[1] == MESSAGE:
                seqs.append(item[2]['seq'])
        RESULT['from1_while_frozen'] = seqs
        with open(os.path.join(OUT, 'rank0.pid')) as f:
            os.kill(int(f.read()), signal.SIGCONT)
        end = time.monotonic() + 30
        while from0 is None and time.monotonic() < end:
            item = t.recv(0.5)
            if item is not None and item[0] == 0 and item[1] == MESSAGE:
                from0 = bool((item[2]['pad'] == 5).all()) and item[2]['pad'].size == 120 << 10
        RESULT['from0_whole'] = from0
        t.close(2)  # (rank 0 has no transport to answer the goodbye)
    comm.Barrier()
    RESULT['ok'] = True


if __name__ == '__main__':
    if sys.argv[1] == 'frozen_head':  # before MPI starts: no single-copy transfers between the ranks
        os.environ['OMPI_MCA_btl_vader_single_copy_mechanism'] = 'none'
    rank = int(os.environ.get('RANK', os.environ.get('OMPI_COMM_WORLD_RANK', '0')))
    try:
        main()
    except BaseException:
        RESULT['ok'] = False
        RESULT['traceback'] = traceback.format_exc()
        print(RESULT['traceback'], file=sys.stderr, flush=True)
    with open(os.path.join(OUT, f'rank{rank}.json'), 'w') as f:
        json.dump(RESULT, f)
    sys.exit(0 if RESULT.get('ok') else 1)
