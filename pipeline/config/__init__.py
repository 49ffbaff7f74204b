"""The config layer: the only code that imports Hydra or OmegaConf.

It composes the YAML under `conf/` (plus a user's `--config-dir`) against typed schemas,
decides which strategy is active (`eligibility`), instantiates only the project's own stages
(`assemble`), validates every option (`validate`), and hands the rest of the program one frozen
`Job`: typed once, in the parent, before any rank starts.
"""
