"""The core layer: what moves where, as plain data and arithmetic.

Model geometry, topology, ownership, strategy knobs, slot/page arithmetic, pool sizing and the
frozen per-transfer plan. No process group, no stream, no Hydra: everything here can be
computed for any rank of any topology on a laptop, and the layers above only consume it.
"""
