"""A router's view of one engine: subscribe to its KV events, back up two pages (named by their
keys) and write them back, then ask the replay socket for every batch from sequence 0 (a
subscriber that joins late, or missed the first, does the same) and print each event.

One CPU rank with a file store in a temporary folder; run from anywhere:
    python examples/kv_events.py
"""

from __future__ import annotations

import socket
import tempfile

import msgspec
import torch
import torch.distributed as dist
import zmq

import pipeline


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def replayed(replay: str) -> list[tuple[int, list]]:
    """Every batch the publisher kept, from sequence 0: (sequence, [ts, events, dp_rank])."""
    asker = zmq.Context.instance().socket(zmq.DEALER)
    asker.connect(replay)
    asker.send_multipart([b"", (0).to_bytes(8, "big")])  # from sequence 0 on
    found = []
    while True:
        _, _, seq, payload = asker.recv_multipart()  # '', topic, sequence, batch
        if int.from_bytes(seq, "big", signed=True) == -1:  # the end of the replay
            asker.close()
            return found
        found.append((int.from_bytes(seq, "big"), msgspec.msgpack.decode(payload)))


def main() -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    pub, replay = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    with tempfile.TemporaryDirectory() as store:
        job = pipeline.compose(
            [
                *("model=tiny_mla", "topology=tp1", "topology.device=cpu", "storage=file"),
                *(f"storage.path={store}", "events=zmq", f"events.endpoint={pub}"),
                f"events.replay_endpoint={replay}",
            ]
        )
        engine = pipeline.create_engine(job)
        slots = torch.arange(2 * job.model.page_size)  # two pages of device and host slots
        keys = engine.l3_keys(list(range(len(slots))))  # a prefix's token ids: two page keys
        host = engine.host_slots.alloc(len(slots))
        engine.backup(host, slots, keys=keys).wait()  # keys: the host tier names its pages
        engine.write_back(keys, host).wait()
        while engine.num_pending_acks:
            engine.poll()  # a page is said stored as its ack is released
        # A router: every batch from sequence 0, each [ts, events, dp_rank]; an event is a
        # map tagged by its type, with a medium per tier (CPU_PINNED host, DISK file store).
        for seq, (_ts, events, _dp_rank) in replayed(replay):
            for event in events:
                pages = len(event.get("block_hashes", []))
                print(seq, event["type"], event.get("medium", "-"), pages, "pages")
        engine.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
