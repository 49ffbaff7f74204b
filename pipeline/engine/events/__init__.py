"""KV events: which pages the host tier and the L3 store hold, as a router reads them.

The wire format is vLLM's and SGLang's (what Dynamo's and llm-d's routers decode): a ZeroMQ
PUB socket sends (topic, an 8-byte big-endian sequence number, a msgpack batch) per batch; the
batch is the array [ts, events, dp_rank]; each event is a msgpack map tagged by its `type`:
`BlockStored`, `BlockRemoved` or `AllBlocksCleared`, with a `medium` per tier in the
consumer's names (`names.MEDIA`: SGLang's or vLLM's). A ROUTER socket answers a start
sequence number (8 bytes, big-endian) with every kept batch from it, each as (topic,
sequence, batch), then (empty, -1, empty), a bounded window a client (`replay`). The
device tier's events are the serving engine's own.

A page is named by the block hash the engine gave `page_keys` for it, as the engine's own
events send it (`names.wire_hash`), else by its key's first 64 bits as a signed int
(`block_hash`). Publisher j of the engine at data-parallel rank d binds the ports + d x P + j
(`open_events`). `AllBlocksCleared` goes first; a page is
`BlockStored` once its tier holds it durably (host: the backup's ack released by `poll`, or the
intact pages of a load from L3 once read; L3: the write-back's ack) and `BlockRemoved` when its
host slots are freed or the file store evicts its object. Publishing never blocks the caller:
batches queue to the publisher's own thread, which owns both sockets.
"""

from pipeline.engine.events.publisher import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    Publisher,
    block_hash,
)
from pipeline.engine.events.tiers import (
    Keys,
    KvEvents,
    Place,
    backed_up,
    engine_publishers,
    open_events,
)

__all__ = [
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EventBatch",
    "Keys",
    "KvEvents",
    "Place",
    "Publisher",
    "backed_up",
    "block_hash",
    "engine_publishers",
    "open_events",
]
