"""What a load from L3 hands back: its windows' loads as one, and how many pages it loaded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pipeline.engine.cuda.streams import Event, Stream
from pipeline.engine.transfer.executor import LoadHandle


class Loading(Protocol):
    """What a forward waits on: a load's layers and its ack."""

    @property
    def num_layers(self) -> int: ...

    def wait(self, layer: int, consumer: Stream | None = None) -> None: ...

    def ready(self, layer: int) -> bool: ...

    def done(self, consumer: Stream | None = None) -> Event: ...


class WindowedLoad:
    """The loads of consecutive windows of one L3 fetch, waited on as one load: a layer is
    usable once every window has loaded it; the ack is the last window's (each window's
    exchanges and ack are issued after the one before, on the same streams)."""

    def __init__(self, loads: list[LoadHandle]) -> None:
        assert loads, "a windowed load has at least one window"
        self.loads = loads

    @property
    def num_layers(self) -> int:
        return self.loads[0].num_layers

    def wait(self, layer: int, consumer: Stream | None = None) -> None:
        for load in self.loads:
            load.wait(layer, consumer)

    def ready(self, layer: int) -> bool:
        return all(load.ready(layer) for load in self.loads)

    def done(self, consumer: Stream | None = None) -> Event:
        return [load.done(consumer) for load in self.loads][-1]


@dataclass(frozen=True)
class L3Load:
    """What `Engine.load_from_l3` did: how many leading pages it loads, and how."""

    hits: int
    """Pages loaded, from the front of the keys (the same on every rank of the group)."""
    fallback: bool
    """The ranks' plans differed: each read its objects straight into its device pages."""
    handle: Loading | None
    """The load of the hit pages from host to device, per layer: window by window as they
    were read (`WindowedLoad`), or streamed a group of layers at a time
    (`pipeline.engine.l3.load`); None: nothing to load, or a fallback, whose device pages
    are already written in the caller's stream order."""
