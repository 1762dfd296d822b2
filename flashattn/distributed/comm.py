"""One step of a ring: every rank sends tensors to the next rank and receives the same shapes
from the previous one, with torch.distributed.batch_isend_irecv. The step is posted first and
waited for later, so that the transfer runs while the caller computes."""
import torch
import torch.distributed as dist


class RingStep:
    """Posts the send of `tensors` to rank + 1 and the receive of as many new buffers from
    rank - 1 (ranks in `group`, P > 1); wait() returns the received tensors. `tensors` must not
    be written until wait() has returned."""

    def __init__(self, group, world, rank, tensors, tag):
        self._sent = [t.contiguous() for t in tensors]
        self._received = [torch.empty_like(t) for t in self._sent]
        send_to = dist.get_global_rank(group, (rank + 1) % world)
        recv_from = dist.get_global_rank(group, (rank - 1) % world)
        ops = [dist.P2POp(dist.isend, t, send_to, group, tag) for t in self._sent]
        ops += [dist.P2POp(dist.irecv, t, recv_from, group, tag) for t in self._received]
        self._works = dist.batch_isend_irecv(ops)

    def wait(self):
        for work in self._works:
            work.wait()
        self._sent = None
        return self._received
