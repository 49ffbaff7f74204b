"""The engine: moves the bytes of one rank.

The top level is the Engine API and its lifetime: `engine` (what a serving engine calls),
`factory` (the one way an engine is made), `runtime` and `groups` (process groups, streams),
`allocate` and `adopt` (its pools), `strategy` (its stage lists), `acks`, `host_slots` and
`metrics`. Beneath it, three rooms, lowest first: `cuda` (copy calls and streams), `transfer`
(how one backup or load is issued), `l3` (the L3 tier and its stores).
"""
