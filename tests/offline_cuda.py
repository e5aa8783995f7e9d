"""Compile CUDA kernels for sm_90 through numba-cuda's normal dispatch (disk cache included) on a
machine without a GPU or driver: import this first, in a process without NUMBA_ENABLE_CUDASIM.

numba-cuda asks the driver for the compute capability (the codegen's cache key, the library's
default target) and loads each new kernel into a context (`bind`); here the capability is 9.0 and
binding only links the cubin (nvJitLink, no driver). Nothing can be launched.
"""
import numba.cuda.dispatcher as dispatcher
from numba.cuda import codegen


class _Sm90:
    compute_capability = (9, 0)


dispatcher.get_current_device = lambda: _Sm90()
codegen.CUDACodeLibrary._ensure_cc = lambda self, cc: (9, 0) if cc is None else cc
codegen.JITCUDACodegen.magic_tuple = lambda self: ("offline", (9, 0))
dispatcher._Kernel.bind = lambda self: self._codelibrary.get_cubin()
