"""Several workers for one trial: the trial's task is rank 0, it starts the
other ranks as Ray tasks and they meet in a torch.distributed rendezvous
(gloo on CPU, NCCL on GPU) that rank 0 hosts. The training itself, DDP
included, is ``archsearch.train``'s and knows nothing of Ray.

On a node whose Ray address is loopback (the private embedded Ray) the
rendezvous is a file and gloo binds to ``lo``, so nothing listens beyond
127.0.0.1; on a cluster it is a TCP store on rank 0's node address.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from archsearch.execute.cluster import LOOPBACK

# A rank that waits longer than this for the others gives up (a dead peer).
RENDEZVOUS_TIMEOUT = timedelta(minutes=5)


@contextmanager
def data_parallel_ranks(payload: dict) -> Iterator[Any]:
    """In a trial's task: None for one worker; else this task as rank 0 of
    ``payload["workers"]["count"]``, the others started and joined; they are
    waited for (their errors raised) or cancelled when the trial ends."""
    import ray
    import torch.distributed as dist

    count = payload["workers"]["count"]
    if count == 1:
        yield None
        return
    host, folder = ray.util.get_node_ip_address(), None
    if host in LOOPBACK:
        folder = tempfile.mkdtemp(prefix="archsearch-ddp-")
        meeting, store = f"{folder}/store", None
    else:
        store = dist.TCPStore(host, 0, world_size=count, is_master=True, timeout=RENDEZVOUS_TIMEOUT,
                              wait_for_workers=False)
        meeting = f"{host}:{store.port}"
    helper = ray.remote(**payload["workers"]["options"])(_other_rank)
    others = [helper.remote(payload, rank=index, meeting=meeting) for index in range(1, count)]
    try:
        with _group(rank=0, payload=payload, meeting=meeting, store=store) as rank:
            yield rank
        ray.get(others)
    finally:
        for other in others:
            ray.cancel(other, force=True)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def _other_rank(payload: dict, *, rank: int, meeting: str) -> None:
    """Ranks 1..N-1: the same training, reading the trial's checkpoint, writing nothing."""
    from archsearch.execute.task import renice

    if payload.get("nice") is not None:  # first, as rank 0 does, so every thread inherits it
        renice(payload["nice"])
    from archsearch.arch.spec import ArchSpec
    from archsearch.execute.preflight import use_kernel_settings
    from archsearch.train import checkpoint, train_trial

    use_kernel_settings(payload["kernels"])
    location = payload["checkpoint_dir"]
    local = tempfile.mkdtemp(prefix="archsearch-rank-") if checkpoint.is_uri(location) else None
    try:
        if local is not None:
            checkpoint.pull(location, local)
        with _group(rank=rank, payload=payload, meeting=meeting) as this:
            train_trial(spec=ArchSpec.from_dict(payload["spec"]), recipe=payload["recipe"], data=payload["data"],
                        seed=payload["seed"], threads=payload["threads"], checkpoint_dir=local or location,
                        stop_at=payload["stop_at"], rank=this)
    finally:
        if local is not None:
            shutil.rmtree(local, ignore_errors=True)


@contextmanager
def _group(*, rank: int, payload: dict, meeting: str, store: Any = None) -> Iterator[Any]:
    """The default process group met at ``meeting`` (a file path, or HOST:PORT
    of rank 0's TCP store), torn down afterwards (Ray reuses worker processes)."""
    import torch
    import torch.distributed as dist

    from archsearch.train.distributed import Rank

    count = payload["workers"]["count"]
    if store is None and meeting.startswith("/"):
        store = dist.FileStore(meeting, count)
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # else gloo listens on the machine's network address
    elif store is None:
        host, _, port = meeting.rpartition(":")
        store = dist.TCPStore(host, int(port), world_size=count, is_master=False, timeout=RENDEZVOUS_TIMEOUT)
    # NCCL wants one GPU per rank: workers sharing one (a fraction each) talk through gloo.
    gpus = payload["workers"]["options"]["num_gpus"]
    backend = "nccl" if gpus >= 1 and torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, store=store, rank=rank, world_size=count, timeout=RENDEZVOUS_TIMEOUT)
    try:
        yield Rank(rank=rank, world=count, group=dist.group.WORLD)
    finally:
        dist.destroy_process_group()
