"""Types of the compiled `_blocks.c` (see its comment)."""

import numpy as np

def copy_blocks(dst: np.ndarray, src: np.ndarray, width: int, threads: int = 1) -> None: ...
