"""The host tier's and the store's KV events, as vLLM's own types (`take_events`: vLLM's
scheduler publishes them with its own device-tier events): its block hashes in its own events'
form, media `CPU` and `STORAGE` (`locality` LOCAL for the file store, REMOTE for Mooncake)."""

from __future__ import annotations

from collections.abc import Sequence

from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVCacheEvent
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash
from vllm.v1.request import Request

from pipeline.config.job import Job
from pipeline.core.events import EventsMedia
from pipeline.core.storage import WriteAdmission
from pipeline.engine.events.names import MEDIA, Medium
from pipeline.integrations.vllm.directory import BlockHash


class TierEvents:
    """Events of the moves a step planned, said once the workers returned that step."""

    def __init__(self, job: Job) -> None:
        self.block_size = job.model.page_size
        media = MEDIA[EventsMedia.vllm]
        self.host = media[None]
        # a write-back stores every page only under write_admission=always: else the
        # scheduler cannot know which, and says none
        storage = job.storage
        admits_all = storage.write_admission is WriteAdmission.always
        self.store = media.get(storage.kind) if admits_all and storage.attached else None
        self._planned: list[KVCacheEvent] = []
        self._ready: list[KVCacheEvent] = []

    def backed_up(self, request: Request, blocks: Sequence[int]) -> None:
        """The request's blocks (indices) a step backs up (and writes back)."""
        self._stored(request, blocks, [self.host, *([self.store] if self.store else [])])

    def host_loaded(self, request: Request, blocks: Sequence[int]) -> None:
        """The request's blocks (indices) a step loads from the store through the host."""
        self._stored(request, blocks, [self.host])

    def _stored(self, request: Request, blocks: Sequence[int], media: list[Medium]) -> None:
        hashes, tokens = request.block_hashes, request.all_token_ids
        for i in blocks:
            parent = maybe_convert_block_hash(hashes[i - 1]) if i else None
            ids = list(tokens[i * self.block_size : (i + 1) * self.block_size])
            for medium, locality in media:
                said = BlockStored(
                    block_hashes=[maybe_convert_block_hash(hashes[i])],
                    parent_block_hash=parent,
                    token_ids=ids,
                    block_size=self.block_size,
                    lora_id=None,
                    medium=medium,
                    lora_name=None,
                    locality=locality,
                )
                self._planned.append(said)

    def evicted(self, hashes: Sequence[BlockHash]) -> None:
        if hashes:
            converted = [maybe_convert_block_hash(h) for h in hashes]
            self._planned.append(BlockRemoved(block_hashes=converted, medium=self.host[0]))

    def returned(self) -> None:
        """The workers returned the steps planned so far: their moves are done."""
        self._ready += self._planned
        self._planned = []

    def take(self) -> list[KVCacheEvent]:
        ready, self._ready = self._ready, []
        return ready
