"""Pipeline stages: one small class per file, with pure constructors.

A stage runs once per transfer (`on_transfer(t, stream)`: prepare and finish lists) or for
every step (`on_step(t, step, stream)`: per_step and exchange lists); `RecordEvent` does both.
Configs may only name classes defined in this package that implement the protocol of the
list they stand in (`pipeline.config.assemble` checks, for `validate` and before a rank starts).
"""
