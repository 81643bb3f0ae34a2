"""Runs last (file order): it leaves rank 0's communicator aborted, as a peer timeout does."""

import pytest
import torch

import devcomm


def test_a_peer_that_never_sends_is_a_peer_timeout_naming_it(comm):
    if comm.rank == 0:
        comm.aborted_by_test = True
        buf = torch.zeros(1024, device=comm.device)
        comm.recv(buf, 1)  # rank 1 never sends
        with pytest.raises(devcomm.PeerTimeout) as e:
            comm.synchronize()
        err = e.value
        assert (err.rank, err.peer) == (0, 1), str(err)
        assert "peer 1" in str(err) and err.elapsed_s > 0 and err.op
        assert (buf == 0).all()
        # The communicator is unusable from now on, and says so.
        with pytest.raises(devcomm.Aborted, match="rebuild"):
            comm.all_to_all_single(torch.empty_like(buf), buf)
    comm.host_barrier()  # rank 1 stays until rank 0 has seen the timeout
