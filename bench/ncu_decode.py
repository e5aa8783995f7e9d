"""The decode launch of bench/attention_decode.py (131072 tokens, 32/8/128), run twice, for ncu:
    python3 bench/ncu_decode.py nvfp4 int8@p ..."""
import sys
import torch
sys.path.insert(0, "bench")
import attention_decode as AD
for name in sys.argv[1:]:
    c = AD.Case(torch, name, 131072, 32, 8, 128)
    c.run(); c.run()
    torch.cuda.synchronize()
    print(name, "ran")
    c.free()
