"""Pipeline stages: one small class per file, `__call__(ctx, step, stream)`, pure constructors.

Configs may only name `_target_`s inside this package (validate and assemble both check).
"""
