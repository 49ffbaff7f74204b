"""The L3 tier: a rank's host pages kept as objects in a shared store, and read back.

Its flow, top to bottom: the `Engine` call first (each in `pipeline.engine.l3_calls`, the
engine's side: its KV events and metrics), then the modules it goes through in order.

1. Write-back (`Engine.write_back`). `jobs` checks the keys and host slots (an `ObjectsJob`);
   `tier` (`L3Tier.write_back`) runs the `strategy.l3.write_back` stages (`WriteObjects`) on
   its own thread after the backups before it; `intact` says which pages' objects are stored
   intact already (the others are written, over whatever holds their names); under rotating,
   `shares` sends the writer the other owners' layers first; `pages` says where each unit's
   bytes lie (pool rows, or a staging buffer), and `L3Tier.write` puts the page's one object
   in the store.
2. Lookup (`Engine.lookup`). `L3Tier.lookup`: the MIN over the replica group of each reader's
   leading run of objects present. `store_view` asks the same of the store from a process with
   no engine (a serving engine's scheduler).
3. Load (`Engine.load_from_l3`). `jobs` checks the keys and slots; `load` decides windowed or
   streamed and runs `L3Tier.fetch`: the `strategy.l3.fetch` stages on the caller's thread
   (`AgreeOnPlan`, `ReadObjects`, `AgreeOnHits`). `fetch` starts every page's read and waits
   for them window by window: `batch` reads them all in one native call of the store on
   threads of its own where the pool holds each page as bytes (checked in bulk as each window
   is whole), else a page a task on the I/O threads (`pages` checks each range as it lands);
   each window the group agrees on goes to an ordinary `Engine.load`. Streamed (where it pays:
   `load.auto_layers`), the fetch reads each page's first group of layers, and `runs` reads
   the later groups as the forward waits for them. `handles` is what the load hands back
   (`L3Load`).
4. Prefetch (`Engine.prefetch`, then `Engine.load_prefetched`). `prefetch` runs the fetch
   stages but the last (the plan agreed, the reads started) and returns at once; later it
   agrees on the pages every reader has read, which an ordinary load moves to the device.

Beneath them all, `stores`: blobs by name, in a folder (`files`) or in Mooncake (`mooncake`).
"""
