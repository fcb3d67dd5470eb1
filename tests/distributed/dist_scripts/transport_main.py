"""Two-rank transport scenarios (launched by tests/distributed/test_distributed_faults.py).

late_receiver: rank 0 sends 256 KiB of 0xAB with a 1 s deadline while rank 1 does not read yet (above Open
MPI's shared-memory eager limit and gloo's rendezvous, so the send cannot complete); the send must raise
``SendTimeout`` and keep the frame alive. Rank 0 then scribbles 0xCD over fresh memory and queues a second
message. Rank 1 starts reading after 3 s and must get exactly the 0xAB bytes, then the second message.
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


if __name__ == '__main__':
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
