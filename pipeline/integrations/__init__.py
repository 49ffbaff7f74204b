"""Adapters that let a serving engine's own plug points use this project's L3 stores."""
