"""`asm`: a Numba intrinsic that emits one inline-PTX block (shared by the codec and attention
kernels; their simulator emulations live beside each use), and `prmt`, the byte permute both use."""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import config, types
from numba.extending import intrinsic


def asm(ptx: str, constraints: str, ret, args):
    """A Numba intrinsic emitting one inline-PTX block with a fixed signature (arguments are cast
    to `args`; a tuple `ret` is a multi-output asm)."""
    names = ", ".join(f"a{i}" for i in range(len(args)))

    def codegen(context, builder, sig, llargs):
        lt = [context.get_value_type(t) for t in args]
        tup = isinstance(ret, types.BaseTuple)
        rt = ir.LiteralStructType([context.get_value_type(t) for t in ret.types]) if tup else context.get_value_type(ret)
        r = builder.call(ir.InlineAsm(ir.FunctionType(rt, lt), ptx, constraints, side_effect=False), list(llargs))
        if tup:
            return context.make_tuple(builder, ret, [builder.extract_value(r, i) for i in range(len(ret.types))])
        return r

    ns = {"ret": ret, "args": args, "codegen": codegen}
    exec(f"def f(typingctx, {names}):\n    return ret(*args), codegen\n", ns)
    return intrinsic(ns["f"])


def sim_prmt(a, b, sel):
    """prmt.b32 (default mode) from the PTX ISA: result byte i is byte n & 7 of b:a for selector
    nibble n = (sel >> 4 i) & 15, or, when n & 8, that byte's sign replicated (0x00 / 0xFF)."""
    src = int(a) | (int(b) << 32)
    r = 0
    for i in range(4):
        n = (int(sel) >> (4 * i)) & 15
        byte = (src >> (8 * (n & 7))) & 0xFF
        r |= ((0xFF if byte & 0x80 else 0) if n & 8 else byte) << (8 * i)
    return np.uint32(r)


prmt = sim_prmt if config.ENABLE_CUDASIM else asm(
    "prmt.b32 $0, $1, $2, $3;", "=r,r,r,r", types.uint32, (types.uint32, types.uint32, types.uint32))
