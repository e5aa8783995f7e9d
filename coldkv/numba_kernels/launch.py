"""Kernel launches that Numba's `kernel[grid, block, stream](...)` cannot express.

`launch_dependent`: a programmatic dependent launch (Hopper). The kernel may start while the one
before it on the stream is still running, from when each of that kernel's blocks has run
`griddepcontrol.launch_dependents` (mma_ptx.griddep_launch) or exited; it must run
`griddepcontrol.wait` (mma_ptx.griddep_wait) before it reads what that kernel wrote. What this
hides is the gap between two dependent kernels: the second one's launch and block start-up run
under the first one's last blocks. Captured into a CUDA graph, the edge stays programmatic.
"""
from __future__ import annotations

import functools


@functools.cache
def has_dependent_launch() -> bool:
    """Whether this cuda.core's LaunchConfig takes programmatic_stream_serialization (the GPU must
    be sm_90 or newer too: the caller knows its compute capability)."""
    from numba import config

    if config.ENABLE_CUDASIM:
        return True  # launches run one after another there: nothing to overlap, nothing to break
    try:
        from cuda.core import LaunchConfig

        LaunchConfig(grid=1, block=32, programmatic_stream_serialization=True)
    except (ImportError, TypeError):
        return False
    return True


def launch_dependent(kernel, griddim, blockdim, stream, *args) -> None:
    """kernel[griddim, blockdim, stream](*args) with programmatic stream serialization: Numba's
    own argument marshalling and stream handling, cuda.core's launch. The caller checks
    `has_dependent_launch()` and the GPU (sm_90+) first."""
    from numba import config

    configured = kernel[griddim, blockdim, stream]  # normalized dimensions and stream
    if config.ENABLE_CUDASIM:
        configured(*args)
        return
    from cuda.core import LaunchConfig, launch

    compiled = kernel.compile(tuple(kernel.typeof_pyval(a) for a in args))
    keep, kargs = [], []  # keep: numba's write-back functors (none for device arrays)
    for ty, val in zip(compiled.argument_types, args):
        compiled._prepare_args(ty, val, configured.stream, keep, kargs)
    cfg = LaunchConfig(grid=configured.griddim, block=configured.blockdim, shmem_size=0,
                       programmatic_stream_serialization=True)
    launch(configured.stream, cfg, compiled._codelibrary.get_cufunc().kernel, *kargs)
