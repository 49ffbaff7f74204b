"""The engine's L3 calls, as they run: write-back (after write admission), load from L3, and
the load of a prefetch, each saying what it stored to the engine's KV events."""

from __future__ import annotations

import time
from typing import Protocol

import torch

from pipeline.core.plan import PlanSpec
from pipeline.engine.cuda.streams import Event
from pipeline.engine.events import KvEvents
from pipeline.engine.l3.handles import L3Load, WindowedLoad
from pipeline.engine.l3.jobs import objects_job
from pipeline.engine.l3.load import Loader, stream_from_l3, streamed_layers, windowed_from_l3
from pipeline.engine.l3.prefetch import Prefetch, agreed_pages, refused
from pipeline.engine.l3.tier import L3Tier
from pipeline.engine.metrics import EngineMetrics


class Engine(Loader, Protocol):
    """What the L3 calls need of the engine."""

    spec: PlanSpec
    events: KvEvents | None
    metrics: EngineMetrics


def write_back(
    engine: Engine, tier: L3Tier, keys: list[str], host_indices: torch.Tensor, after: Event | None
) -> Event:
    """`Engine.write_back` (after the backup `after`): its ack's release says that the host
    pages hold `keys`' pages and the store the admitted ones. One that finds its bound of
    pages queued ahead of it (`storage.write_back_queue_pages`) stores none: the store is
    behind the writes, and the host tier must not fill with what waits for it."""
    job = objects_job(keys, host_indices, None, engine.spec, engine.host_allocator)
    bound = tier.storage.write_back_queue_pages
    if bound and engine.acks.held_pages("write_back") >= bound:  # rank-replicated: alike
        admitted = tier.dropped(job)
    else:
        admitted = tier.admitted(job)  # storage.write_admission
    done = tier.write_back(engine.strategy.l3.write_back, admitted, after)
    events = engine.events
    said = None
    if events is not None:
        said = events.written_back(job.host_pages.tolist(), keys, admitted.keys)
    engine.acks.submit("write_back", done, said, pages=len(admitted.keys))
    return done


def load_from_l3(
    engine: Engine, tier: L3Tier, keys: list[str], slots: tuple[torch.Tensor, torch.Tensor]
) -> L3Load:
    """`Engine.load_from_l3` into `slots` (host, device): streamed or window by window; its
    hit pages said to be in the host tier once they have landed."""
    (host_indices, device_indices), start = slots, time.monotonic()
    job = objects_job(keys, host_indices, device_indices, engine.spec, engine.host_allocator)
    if per_group := streamed_layers(engine, tier, len(keys)):
        loaded = stream_from_l3(engine, tier, job, per_group, slots)
    else:
        loaded = windowed_from_l3(engine, tier, job, slots)
    if engine.events is not None and not loaded.fallback:  # a fallback fills no host page
        pages = job.host_pages[: loaded.hits].tolist()
        engine.events.landing(loaded.handle, pages, keys[: loaded.hits])
    engine.metrics.observe("fetch", time.monotonic() - start)
    return loaded


def load_prefetched(
    engine: Engine, tier: L3Tier, prefetch: Prefetch, device_indices: torch.Tensor
) -> L3Load:
    """`Engine.load_prefetched`: the agreed pages loaded, the rest freed."""
    slots = engine.host_allocator
    why = refused(prefetch, device_indices, engine.spec, slots)
    hits = agreed_pages(tier, prefetch, why)
    prefetch.end("loaded", free=slice(hits, None))
    job = prefetch.job
    slots.hold_data(job.host_pages[:hits])
    taken, host = slice(0, hits * engine.sizing.slots_per_page), prefetch.host_indices
    load = engine.load(host[taken], device_indices[taken]) if hits else None
    engine.metrics.observe("fetch", time.monotonic() - prefetch.started_s)
    if engine.events is not None:
        engine.events.landing(load, job.host_pages[:hits].tolist(), job.keys[:hits])
    return L3Load(hits, False, WindowedLoad([load]) if load else None)
