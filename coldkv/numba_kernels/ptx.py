"""`asm`: a Numba intrinsic that emits one inline-PTX block (shared by the codec and attention
kernels; their simulator emulations live beside each use)."""
from __future__ import annotations

from llvmlite import ir
from numba import types
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
