"""rANS cold slots: the spec (pure Python reference), njit CPU coder, CUDA encoder and warp decoder.

Design (DietGPU-style; byte layouts in docs/formats.md "# Cold slots"):
- A *section* codes a byte sequence: segment A (n_a bytes) then segment B (n_b bytes, may be
  empty), each with its own model. A page slot codes the packed codes as A and the E4M3 scale
  bytes as B in ONE section, so the scales share the lane states instead of paying for their own.
- A byte is a pair of nibbles (lo = bits 0-3, hi = bits 4-7) coded as ONE rANS symbol under a
  product model p(byte) = p_lo(lo) * p_hi(hi). For packed E2M1/ISO3 codes a byte is two codes
  (element 2i low): one decode step yields two codes (half the steps of a 16-symbol coder) and
  writes exactly the packed byte. Codes use one table for both nibbles; scale bytes two.
- Each nibble table sums to 256 (8-bit probabilities, 1..255 for a present nibble), so the pair
  model sums to 2^16 without normalisation: the 16-bit slot `s` of a state splits into `s >> 8`
  (hi table) and `s & 255` (lo table); pair (a, b) owns the rectangle [cum_hi(b), +f_hi(b)) x
  [cum_lo(a), +f_lo(a)). Decoding is two 256-entry lookups and no division per step.
- 32 interleaved 32-bit states (one per warp lane), state interval [2^16, 2^32), 16-bit
  renormalisation words in ONE stream shared by the lanes: byte i belongs to lane i % 32, step
  i // 32. A lane needs at most one word per step, so the warp decoder reads its words with
  ballot + popc (a prefix over the lanes that need one).
- State payload (bits-back): each lane's last <= 3 bytes are not coded but stored in its initial
  encoder state x0 = 2^24 | b0 | b1 << 8 | b2 << 16, which the decoder recovers as its final
  state. This saves the ~16 bits per lane that a fixed initial state L wastes, and the marker
  (x >> 24 == 1, unused payload bytes 0) plus the exact word count remain an integrity check.

Every decoder here returns a status code (0 = ok); coldkv.codecs.slots raises CorruptSlotError.
"""
from __future__ import annotations

import numpy as np
from numba import cuda, int32, njit, uint32, uint64

from coldkv.numba_kernels.jit_cache import cuda_kernel

LANES = 32
STATE_L = 1 << 16  # lower end of the state interval
NIB_TOTAL = 256  # each nibble table sums to 2^8 -> pair model sums to 2^16
FREQ_MAX = 255  # a nibble frequency must fit a byte
STATES_BYTES = 4 * LANES
PAYLOAD_MARK = 1 << 24  # initial state = mark | up to 3 payload bytes
TAIL = 3 * LANES  # bytes [max(N - 96, 0), N) live in the lane states, not in the stream
# A coded step raises a lane's state by >= 511 * (x // 65025) (pair frequencies <= 255^2), i.e. by
# >= 511 * 2^(k-16) in the octave [2^k, 2^k+1): at most 129 steps per octave, 16 octaves, so a
# lane codes <= 2064 bytes between two words. Headers claiming more bytes than
# STEPS_PER_WORD * (words + 32) + TAIL are refused before anything is allocated or decoded.
STEPS_PER_WORD = 2080

# Page slot (little endian): 16-byte header, then the body.
#   0 u16 magic 0x4B43 ("CK")  2 u8 version  3 u8 flags (bit0: coded) | format id << 4
#   4 u16 tokens  6 u16 head_dim  8 u32 stream words (0 when raw)  12 u32 fp32 bits of global scale
# coded body: one section, A = codes (one table), B = scales (two tables)
# raw body: codes bytes, zero pad to 4, scale bytes, zero pad to 4
SLOT_MAGIC = 0x4B43
SLOT_VERSION = 1
SLOT_HEADER = 16
F_CODED = 1
FMT_GROUP = (0, 0, 16, 16, 64)  # format id -> values per E4M3 scale (nvfp4=2, iso3=3, c4g64=4)

# Stream blob (rans_encode), little endian, 12-byte header, then one section (A only) or raw bytes:
#   0 u16 magic 0x5243 ("CR")  2 u8 version  3 u8 flags (bit0 coded, bit4 alphabet 256)
#   4 u32 symbol count  8 u32 stream words
STREAM_MAGIC = 0x5243
STREAM_HEADER = 12
S_CODED = 1
S_BYTES = 16
STREAM_FLAGS_MASK = S_CODED | S_BYTES

# decoder status codes
OK = 0
E_HEADER = 1  # magic, version, flags, format, shape fields
E_LENGTH = 2  # blob length does not match the header, or the output is too small
E_TABLE = 3  # a nibble table does not sum to 256
E_STATE = 4  # an initial state below L
E_OVERRUN = 5  # the lanes need more words than the section holds
E_FINAL = 6  # words left over, or a final state that is not a payload state
E_PADDING = 7  # nonzero padding

ERROR_TEXT = {
    E_HEADER: "bad header (magic, version, flags, format or shape)",
    E_LENGTH: "length does not match the header",
    E_TABLE: "frequency table does not sum to 256",
    E_STATE: "initial rANS state out of range",
    E_OVERRUN: "rANS stream ran out",
    E_FINAL: "rANS stream inconsistent (final states or word count)",
    E_PADDING: "nonzero padding",
}


def section_tables_bytes(one_a: bool, n_b: int, one_b: bool) -> int:
    return (16 if one_a else 32) + (0 if n_b == 0 else (16 if one_b else 32))


def coded_section_bytes(one_a: bool, n_b: int, one_b: bool, words: int) -> int:
    return (section_tables_bytes(one_a, n_b, one_b) + STATES_BYTES + 2 * words + 3) & ~3


def slot_capacity(n_codes: int, n_scales: int) -> int:
    """Bytes an encoder may touch for one page: header + both parts raw (a coded slot is smaller)."""
    return SLOT_HEADER + ((n_codes + 3) & ~3) + ((n_scales + 3) & ~3)


# --------------------------------------------------------------------------------------------
# The spec: pure Python (slow, small inputs). Shares no code with the kernels below.
# --------------------------------------------------------------------------------------------

def ref_quantize_freqs(hist) -> list[int]:
    """Counts of 16 nibbles -> frequencies summing to 256 (present >= 1, each <= 255).

    Floor of c*256/n (at least 1), then +1 to the symbol of largest c/f while short and -1 from
    the symbol of smallest c/(f-1) while over; integer comparisons so CPU and GPU agree exactly.
    """
    hist = [int(c) for c in hist]
    n = sum(hist)
    f = [min(FREQ_MAX, max(1, c * NIB_TOTAL // n)) if c > 0 else 0 for c in hist]
    total = sum(f)
    while total < NIB_TOTAL:
        best = -1
        for s in range(16):
            if hist[s] > 0 and f[s] < FREQ_MAX and (best < 0 or hist[s] * f[best] > hist[best] * f[s]):
                best = s
        if best < 0:  # every present symbol is at 255 (or none): the first symbol below 255
            best = next(s for s in range(16) if f[s] < FREQ_MAX)
        f[best] += 1
        total += 1
    while total > NIB_TOTAL:
        best = -1
        for s in range(16):
            if f[s] > 1 and (best < 0 or hist[s] * (f[best] - 1) < hist[best] * (f[s] - 1)):
                best = s
        f[best] -= 1
        total -= 1
    return f


def _ref_tables(seg: bytes, one: bool) -> tuple[list[int], list[int]]:
    hlo, hhi = [0] * 16, [0] * 16
    for v in seg:
        hlo[v & 15] += 1
        (hlo if one else hhi)[v >> 4] += 1
    flo = ref_quantize_freqs(hlo)
    return flo, (flo if one else ref_quantize_freqs(hhi))


def ref_encode_section(seg_a: bytes, one_a: bool, seg_b: bytes = b"", one_b: bool = False):
    """Bytes -> (tables [A lo, A hi, B lo, B hi] (B empty if no B), 32 final states, words)."""
    data = bytes(seg_a) + bytes(seg_b)
    n, na = len(data), len(seg_a)
    tables = list(_ref_tables(seg_a, one_a)) + (list(_ref_tables(seg_b, one_b)) if seg_b else [])
    cums = [[sum(t[:s]) for s in range(16)] for t in tables]
    p0 = max(n - TAIL, 0)
    states = []
    for lane in range(LANES):
        idx = [i for i in range(p0, n) if i % LANES == lane]
        states.append(PAYLOAD_MARK | sum(data[i] << (8 * t) for t, i in enumerate(idx)))
    rev_words = []
    for i in reversed(range(p0)):
        lane = i % LANES
        t = 0 if i < na else 2
        a, b = data[i] & 15, data[i] >> 4
        fa, fb = tables[t][a], tables[t + 1][b]
        x = states[lane]
        if x >= (fa * fb) << 16:
            rev_words.append(x & 0xFFFF)
            x >>= 16
        q, r = divmod(x, fa * fb)
        states[lane] = (q << 16) | ((cums[t + 1][b] + r // fa) << 8) | (cums[t][a] + r % fa)
    return tables, states, rev_words[::-1]


def ref_decode_section(na: int, nb: int, tables, states, words) -> bytes:
    """Inverse of ref_encode_section; raises ValueError on inconsistent input."""
    n = na + nb
    cums = [[sum(t[:s]) for s in range(16)] for t in tables]
    sym_of = [[s for s in range(16) for _ in range(t[s])] for t in tables]
    states = list(states)
    out = bytearray(n)
    p0 = max(n - TAIL, 0)
    pos = 0
    for i in range(p0):
        lane = i % LANES
        t = 0 if i < na else 2
        x = states[lane]
        s = x & 0xFFFF
        b, a = sym_of[t + 1][s >> 8], sym_of[t][s & 255]
        fa = tables[t][a]
        x = fa * tables[t + 1][b] * (x >> 16) + ((s >> 8) - cums[t + 1][b]) * fa + (s & 255) - cums[t][a]
        out[i] = a | (b << 4)
        if x < STATE_L:
            if pos >= len(words):
                raise ValueError("stream ran out")
            x = (x << 16) | words[pos]
            pos += 1
        states[lane] = x
    for lane in range(LANES):
        x = states[lane]
        idx = [i for i in range(p0, n) if i % LANES == lane]
        for t, i in enumerate(idx):
            out[i] = (x >> (8 * t)) & 0xFF
        if x >> (8 * len(idx)) != PAYLOAD_MARK >> (8 * len(idx)):
            raise ValueError("bad final state")
    if pos != len(words):
        raise ValueError("words left over")
    return bytes(out)


# --------------------------------------------------------------------------------------------
# Scalar building blocks compiled twice (njit for the CPU; cuda device functions for the GPU
# encoder, which runs the same serial code one thread per page): one source, identical bytes.
# --------------------------------------------------------------------------------------------

def _build(jit):
    @jit
    def put_u16(buf, off, v):
        buf[off] = v & 0xFF
        buf[off + 1] = (v >> 8) & 0xFF

    @jit
    def put_u32(buf, off, v):
        buf[off] = v & 0xFF
        buf[off + 1] = (v >> 8) & 0xFF
        buf[off + 2] = (v >> 16) & 0xFF
        buf[off + 3] = (v >> 24) & 0xFF

    @jit
    def rd8(s16, base, off):
        # byte `off` of a slot stored as little-endian uint16 words starting at word `base`
        w = np.int64(s16[base + (off >> 1)])
        return (w >> ((off & 1) * 8)) & 0xFF

    @jit
    def rd16(s16, base, off):  # off even
        return np.int64(s16[base + (off >> 1)])

    @jit
    def rd32(s16, base, off):  # off even
        return np.int64(s16[base + (off >> 1)]) | (np.int64(s16[base + (off >> 1) + 1]) << 16)

    @jit
    def quantize_freqs(hist, h0, freqs, f0):
        # hist[h0:h0+16] counts -> freqs[f0:f0+16] summing to 256 (spec: ref_quantize_freqs)
        n = np.int64(0)
        for s in range(16):
            n += hist[h0 + s]
        total = 0
        for s in range(16):
            c = np.int64(hist[h0 + s])
            f = 0
            if c > 0:
                f = max(1, min(FREQ_MAX, (c * NIB_TOTAL) // n))
            freqs[f0 + s] = f
            total += f
        while total < NIB_TOTAL:
            best = -1
            for s in range(16):
                c = np.int64(hist[h0 + s])
                f = np.int64(freqs[f0 + s])
                if c > 0 and f < FREQ_MAX:
                    if best < 0:
                        best = s
                    elif c * np.int64(freqs[f0 + best]) > np.int64(hist[h0 + best]) * f:
                        best = s
            if best < 0:
                for s in range(16):
                    if best < 0 and freqs[f0 + s] < FREQ_MAX:
                        best = s
            freqs[f0 + best] += 1
            total += 1
        while total > NIB_TOTAL:
            best = -1
            for s in range(16):
                c = np.int64(hist[h0 + s])
                f = np.int64(freqs[f0 + s])
                if f > 1:
                    if best < 0:
                        best = s
                    elif c * (np.int64(freqs[f0 + best]) - 1) < np.int64(hist[h0 + best]) * (f - 1):
                        best = s
            freqs[f0 + best] -= 1
            total -= 1

    @jit
    def seg_byte(a, a_off, na, b, b_off, i):
        if i < na:
            return np.int64(a[a_off + i])
        return np.int64(b[b_off + i - na])

    @jit
    def encode_section(a, a_off, na, one_a, b, b_off, nb, one_b, out, off, budget, max_words,
                       hist, freqs, states):
        """Code a[a_off:+na] then b[b_off:+nb] into out[off:off+budget] as one coded section.

        Returns the word count, or -1 when the padded section would not be smaller than `budget`
        (the caller stores the bytes raw). Layout: tables, 32 u32 states, words (u16), zero pad
        to 4. Words are written backwards from the end of the budget and moved down at the end.
        Scratch: hist int64[64], freqs int64[128] (4 tables, then their cumulative sums),
        states int64[32].
        """
        n = na + nb
        ta = 16 if one_a else 32
        tb = ta + (0 if nb == 0 else (16 if one_b else 32))
        wbase = off + tb + STATES_BYTES
        cap = (budget - tb - STATES_BYTES - 4) // 2  # padded section must stay below budget
        if cap > max_words:
            cap = max_words
        if cap < 0 or n == 0:
            return -1
        for s in range(64):
            hist[s] = 0
        for i in range(n):
            v = seg_byte(a, a_off, na, b, b_off, i)
            t = 0 if i < na else 32
            one = one_a if i < na else one_b
            hist[t + (v & 15)] += 1
            hist[t + (0 if one else 16) + (v >> 4)] += 1
        for t in range(0, 4, 2):
            one = one_a if t == 0 else one_b
            quantize_freqs(hist, 16 * t, freqs, 16 * t)
            if one:
                for s in range(16):
                    freqs[16 * t + 16 + s] = freqs[16 * t + s]
            else:
                quantize_freqs(hist, 16 * t + 16, freqs, 16 * t + 16)
        for t in range(4):
            c = 0
            for s in range(16):
                freqs[64 + 16 * t + s] = c
                c += freqs[16 * t + s]
        p0 = max(n - TAIL, 0)
        for lane in range(LANES):
            i = p0 + ((lane - p0) & (LANES - 1))
            x = np.int64(PAYLOAD_MARK)
            for t in range(3):
                if i < n:
                    x |= seg_byte(a, a_off, na, b, b_off, i) << (8 * t)
                i += LANES
            states[lane] = x
        p = cap  # the next word goes to index p - 1 of the word area
        for k in range(p0):
            i = p0 - 1 - k
            lane = i & (LANES - 1)
            v = seg_byte(a, a_off, na, b, b_off, i)
            t = 0 if i < na else 32
            fa = np.int64(freqs[t + (v & 15)])
            fb = np.int64(freqs[t + 16 + (v >> 4)])
            f = fa * fb
            x = np.int64(states[lane])
            if x >= (f << 16):
                if p == 0:
                    return -1
                p -= 1
                put_u16(out, wbase + 2 * p, x & 0xFFFF)
                x >>= 16
            q = x // f
            r = x - q * f
            hi_i = r // fa
            lo_i = r - hi_i * fa
            states[lane] = ((q << 16) | ((np.int64(freqs[64 + t + 16 + (v >> 4)]) + hi_i) << 8)
                            | (np.int64(freqs[64 + t + (v & 15)]) + lo_i))
        words = cap - p
        # move the words down to the start of the word area (dst < src: ascending copy is safe)
        for k in range(2 * words):
            out[wbase + k] = out[wbase + 2 * p + k]
        end = wbase + 2 * words
        while (end - off) & 3:
            out[end] = 0
            end += 1
        for s in range(16):
            out[off + s] = freqs[s]
            if not one_a:
                out[off + 16 + s] = freqs[16 + s]
            if nb > 0:
                out[off + ta + s] = freqs[32 + s]
                if not one_b:
                    out[off + ta + 16 + s] = freqs[48 + s]
        for lane in range(LANES):
            put_u32(out, off + tb + 4 * lane, states[lane])
        return words

    @jit
    def put_raw(src, src_off, n, out, off):
        """Raw bytes, zero padded to 4. Returns the padded length."""
        for i in range(n):
            out[off + i] = src[src_off + i]
        end = off + n
        while (end - off) & 3:
            out[end] = 0
            end += 1
        return end - off

    @jit
    def encode_page(codes, codes_off, scales, scales_off, fmt, tokens, head_dim, gbits,
                    out, off, hist, freqs, states):
        """One head-page -> slot bytes at out[off:]. Returns the slot length.

        codes: packed bytes (tokens * head_dim / 2), scales: E4M3 bytes (tokens * head_dim / group);
        out needs slot_capacity(...) bytes at off.
        """
        n_codes = tokens * (head_dim // 2)
        n_scales = tokens * (head_dim // FMT_GROUP[fmt])
        pos = off + SLOT_HEADER
        raw_len = ((n_codes + 3) & ~3) + ((n_scales + 3) & ~3)
        words = encode_section(codes, codes_off, n_codes, True, scales, scales_off, n_scales, False,
                               out, pos, raw_len, 0x7FFFFFFF, hist, freqs, states)
        flags = 0
        if words >= 0:
            flags = F_CODED
            pos += (16 + 32 + STATES_BYTES + 2 * words + 3) & ~3
        else:
            words = 0
            pos += put_raw(codes, codes_off, n_codes, out, pos)
            pos += put_raw(scales, scales_off, n_scales, out, pos)
        put_u16(out, off, SLOT_MAGIC)
        out[off + 2] = SLOT_VERSION
        out[off + 3] = flags | (fmt << 4)
        put_u16(out, off + 4, tokens)
        put_u16(out, off + 6, head_dim)
        put_u32(out, off + 8, words)
        put_u32(out, off + 12, gbits)
        return pos - off

    @jit
    def parse_page_header(s16, base, nbytes, h):
        """Validate a page slot header against the `nbytes` readable at the slot; fill h.

        h (int64[9]): 0 fmt, 1 tokens, 2 head_dim, 3 flags, 4 n_codes, 5 n_scales, 6 words,
        7 slot length, 8 global-scale bits. Returns a status code.
        """
        if nbytes < SLOT_HEADER:
            return E_LENGTH
        if rd16(s16, base, 0) != SLOT_MAGIC or rd8(s16, base, 2) != SLOT_VERSION:
            return E_HEADER
        flags = rd8(s16, base, 3) & 15
        fmt = rd8(s16, base, 3) >> 4
        tokens = rd16(s16, base, 4)
        head_dim = rd16(s16, base, 6)
        words = rd32(s16, base, 8)
        if flags & ~F_CODED:
            return E_HEADER
        if fmt < 2 or fmt > 4 or tokens == 0 or head_dim == 0 or head_dim % FMT_GROUP[fmt] != 0:
            return E_HEADER
        if flags == 0 and words != 0:
            return E_HEADER
        n_codes = tokens * (head_dim // 2)
        n_scales = tokens * (head_dim // FMT_GROUP[fmt])
        if flags and n_codes + n_scales > STEPS_PER_WORD * (words + LANES) + TAIL:
            return E_HEADER
        length = SLOT_HEADER + ((n_codes + 3) & ~3) + ((n_scales + 3) & ~3)
        if flags:
            length = SLOT_HEADER + ((16 + 32 + STATES_BYTES + 2 * words + 3) & ~3)
        if length > nbytes:
            return E_LENGTH
        h[0] = fmt
        h[1] = tokens
        h[2] = head_dim
        h[3] = flags
        h[4] = n_codes
        h[5] = n_scales
        h[6] = words
        h[7] = length
        h[8] = rd32(s16, base, 12)
        return OK

    return (put_u16, put_u32, rd8, rd16, rd32, quantize_freqs, encode_section, put_raw, encode_page,
            parse_page_header)


(_put_u16, _put_u32, cpu_rd8, cpu_rd16, cpu_rd32, cpu_quantize_freqs, cpu_encode_section, cpu_put_raw,
 cpu_encode_page, cpu_parse_page_header) = _build(njit(cache=False))
(_g_put_u16, _g_put_u32, gpu_rd8, gpu_rd16, gpu_rd32, gpu_quantize_freqs, gpu_encode_section,
 gpu_put_raw, gpu_encode_page, gpu_parse_page_header) = _build(cuda.jit(device=True))


# --------------------------------------------------------------------------------------------
# CPU decoder (njit): serial emulation of the warp decoder, same word order.
# --------------------------------------------------------------------------------------------

@njit(cache=False)
def cpu_decode_section(s16, base, off, na, one_a, nb, one_b, words, out_a, oa, out_b, ob, tab, st):
    """Decode a coded section at byte `off` of the slot into out_a[oa:+na] and out_b[ob:+nb].

    The caller guarantees the section (tables, states, `words` words, pad) lies in the slot.
    tab: uint32[1024] scratch (A lo, A hi, B lo, B hi; entry = sym | cum << 8 | freq << 16);
    st: int64[32] scratch.
    """
    n = na + nb
    ta = 16 if one_a else 32
    tb = ta + (0 if nb == 0 else (16 if one_b else 32))
    for t in range(4 if nb > 0 else 2):
        t_off = (0 if (t == 0 or one_a) else 16) if t < 2 else ta + (0 if (t == 2 or one_b) else 16)
        total = 0
        for s in range(16):
            f = cpu_rd8(s16, base, off + t_off + s)
            for u in range(total, min(total + f, NIB_TOTAL)):
                tab[256 * t + u] = s | (total << 8) | (f << 16)
            total += f
        if total != NIB_TOTAL:
            return E_TABLE
    for lane in range(LANES):
        x = cpu_rd32(s16, base, off + tb + 4 * lane)
        if x < STATE_L:
            return E_STATE
        st[lane] = x
    wbase = base + ((off + tb + STATES_BYTES) >> 1)
    pos = 0
    p0 = max(n - TAIL, 0)
    for i in range(p0):
        lane = i & (LANES - 1)
        t = 0 if i < na else 512
        x = st[lane]
        s = x & 0xFFFF
        el = np.int64(tab[t + (s & 255)])
        eh = np.int64(tab[t + 256 + (s >> 8)])
        fa = el >> 16
        x = fa * (eh >> 16) * (x >> 16) + ((s >> 8) - ((eh >> 8) & 0xFF)) * fa + (s & 255) - ((el >> 8) & 0xFF)
        v = (el & 15) | ((eh & 15) << 4)
        if i < na:
            out_a[oa + i] = v
        else:
            out_b[ob + i - na] = v
        if x < STATE_L:
            if pos >= words:
                return E_OVERRUN
            x = (x << 16) | np.int64(s16[wbase + pos])
            pos += 1
        st[lane] = x
    if pos != words:
        return E_FINAL
    for lane in range(LANES):
        x = st[lane]
        i = p0 + ((lane - p0) & (LANES - 1))
        for t in range(3):
            v = (x >> (8 * t)) & 0xFF
            if i < n:
                if i < na:
                    out_a[oa + i] = v
                else:
                    out_b[ob + i - na] = v
            elif v != 0:
                return E_FINAL
            i += LANES
        if (x >> 24) != 1:
            return E_FINAL
    if words & 1 and s16[wbase + words] != 0:
        return E_PADDING
    return OK


@njit(cache=False)
def cpu_get_raw(s16, base, off, n, out, out_off):
    for i in range(n):
        out[out_off + i] = cpu_rd8(s16, base, off + i)
    for i in range(n, (n + 3) & ~3):
        if cpu_rd8(s16, base, off + i) != 0:
            return E_PADDING
    return OK


@njit(cache=False)
def cpu_decode_page(s16, base, h, codes, scales, tab, st):
    """Slot body -> codes uint8[n_codes], scales uint8[n_scales]; h from parse_page_header."""
    if h[3] & F_CODED:
        return cpu_decode_section(s16, base, SLOT_HEADER, h[4], True, h[5], False, h[6],
                                  codes, 0, scales, 0, tab, st)
    err = cpu_get_raw(s16, base, SLOT_HEADER, h[4], codes, 0)
    if err != OK:
        return err
    return cpu_get_raw(s16, base, SLOT_HEADER + ((h[4] + 3) & ~3), h[5], scales, 0)


# --------------------------------------------------------------------------------------------
# CUDA: encoder kernel (one thread per page running the shared serial code) and warp decoder.
# --------------------------------------------------------------------------------------------

@cuda_kernel
def encode_pages_kernel(codes, scales, gbits, fmt, tokens, head_dim, out, lengths):
    """codes uint8[P, n_codes], scales uint8[P, n_scales], gbits uint32[P] -> out uint8[P, cap],
    lengths int32[P]. One thread per page; byte-identical to the CPU encoder (same source)."""
    p = cuda.grid(1)
    if p >= codes.shape[0]:
        return
    hist = cuda.local.array(64, np.int64)
    freqs = cuda.local.array(128, np.int64)
    states = cuda.local.array(32, np.int64)
    lengths[p] = gpu_encode_page(codes[p], 0, scales[p], 0, fmt, tokens, head_dim, np.int64(gbits[p]),
                                 out[p], 0, hist, freqs, states)


FULL_MASK = 0xFFFFFFFF


@cuda.jit(device=True)
def _stream_word(s16, wbase, words, k):
    """Renormalisation word k of the section as int32 (for shfl), 0 past the last one (not read)."""
    if k < words:
        return int32(s16[uint64(wbase + k)])
    return int32(0)


@cuda.jit(device=True)
def _fill_symbol(tab, t0, total, s, f, lane):
    """Decode-table entries of symbol s (frequency f, cumulative `total`, uint32) that belong to
    this lane (u = lane mod 32). Entry u = (u - cum) | s * 17 << 8 | f << 16 (the symbol in both
    nibbles, so one table serves lo and hi). Returns the new cumulative total."""
    end = min(uint32(total + f), uint32(NIB_TOTAL))
    u = uint32(total + (uint32(uint32(lane) + uint32(LANES) - (total & uint32(LANES - 1))) & uint32(LANES - 1)))
    e = uint32(uint32((s * 17) << 8) | (f << uint32(16)))
    while u < end:
        tab[t0 + u] = uint32(e + (u - total))
        u = uint32(u + uint32(LANES))
    return uint32(total + f)


@cuda.jit(device=True)
def _decode_steps(s16, wbase, words, tab, out_a, oa, out_b, ob, na, p0, hi_a, j0, j1, uniform,
                  x, pos, wb, r0, r1, r2):
    """Steps j0 <= j < j1 of the warp decoder (see warp_decode_section). `uniform`: every lane
    of these steps decodes a segment-A byte (no per-lane segment or range test).

    Stream words come from a register window: lane k holds words wb + k (r0), wb + 32 + k (r1)
    and wb + 64 + k (r2), loaded coalesced two windows ahead of use. The words a step needs lie
    in [pos, pos + 32) with wb <= pos < wb + 32, so lane k offers r0 if wb + k >= pos, else r1,
    and a lane needing word pos + prefix shuffles it from lane (pos + prefix) mod 32. No global
    load depends on the state; there is no per-step overrun test (words past the end read as 0
    and the final word count decides E_OVERRUN).
    """
    lane = cuda.laneid
    lt = cuda.lanemask_lt()
    io = uint64(oa + j0 * LANES + lane)
    lw = uint32(wb + uint32(lane))  # the word this lane offers from r0
    wn = uint32(wb + uint32(LANES))  # slide the window once pos reaches it
    for j in range(j0, j1):
        offer = r0 if lw >= pos else r1
        need = False
        active = True
        lo = uint32(0)
        hi = uint32(hi_a)
        if not uniform:
            i = j * LANES + lane
            active = i < p0
            if i >= na:
                lo = uint32(512)
                hi = uint32(768)
        if active:
            el = tab[(x & uint32(255)) | lo]
            eh = tab[((x >> uint32(8)) & uint32(255)) | hi]
            x = uint32((el >> uint32(16)) * ((eh >> uint32(16)) * (x >> uint32(16)) + (eh & uint32(255)))
                       + (el & uint32(255)))
            v = uint32((el & uint32(0x0F00)) | (eh & uint32(0xFFFFF0FF))) >> uint32(8)  # low byte counts
            if uniform:
                out_a[io] = v
            else:
                if i < na:
                    out_a[uint64(oa + i)] = v
                else:
                    out_b[uint64(ob + i - na)] = v
            need = x < uint32(STATE_L)
        io += uint64(LANES)
        m = uint32(cuda.ballot_sync(FULL_MASK, need))
        w = cuda.shfl_sync(FULL_MASK, offer, int32(pos + uint32(cuda.popc(m & lt))))
        if need:
            x = uint32((x << uint32(16)) | uint32(w))
        pos = uint32(pos + uint32(cuda.popc(m)))
        if pos >= wn:  # warp-uniform: slide the window by 32 words
            r0 = r1
            r1 = r2
            r2 = _stream_word(s16, wbase, words, uint32(lw + uint32(3 * LANES)))
            lw = uint32(lw + uint32(LANES))
            wn = uint32(wn + uint32(LANES))
    wb = uint32(wn - uint32(LANES))
    return x, pos, wb, r0, r1, r2


@cuda.jit(device=True)
def warp_decode_section(s16, base, off, na, one_a, nb, one_b, words, out_a, oa, out_b, ob, tab):
    """Warp-cooperative decode of a coded section (all 32 lanes call it, converged).

    s16: slot memory as uint16 words, the slot starting at word `base`; `off` (even) is the
    section's byte offset in the slot, and the section (tables, states, `words` words, pad) must
    already be known to lie inside the slot. out_a / out_b: any uint8 arrays (global or shared).
    tab: this warp's uint32[1024] shared-memory decode tables (A at 0, A hi at 256 unless one_a,
    B lo at 512, B hi at 768). Returns a status code (warp-uniform).
    """
    lane = cuda.laneid
    n = na + nb
    ta = 16 if one_a else 32
    tb = ta + (0 if nb == 0 else (16 if one_b else 32))
    w0 = base + (off >> 1)  # first word of the section
    wbase = w0 + ((tb + STATES_BYTES) >> 1)
    # every load of the setup is issued up front (independent, coalesced): frequency bytes (lane
    # k < tb / 2 holds table bytes 2k, 2k + 1), the lane's state, the first 96 stream words
    tw = int32(0)
    if lane < (tb >> 1):
        tw = int32(s16[uint64(w0 + lane)])
    sw = w0 + ((tb >> 1) + 2 * lane)
    x = uint32(uint32(s16[uint64(sw)]) | (uint32(s16[uint64(sw + 1)]) << uint32(16)))
    words32 = uint32(words)
    r0 = _stream_word(s16, wbase, words32, uint32(lane))
    r1 = _stream_word(s16, wbase, words32, uint32(LANES + lane))
    r2 = _stream_word(s16, wbase, words32, uint32(2 * LANES + lane))
    cuda.syncwarp(FULL_MASK)  # a previous decode's table reads are done before we overwrite
    # decode tables: per symbol, lane fills entries u = lane (mod 32)
    bad = False
    for t in range(4 if nb > 0 else 2):
        if t == 1 and one_a:
            continue  # segment A's hi nibble uses the lo table
        t_off = (0 if t == 0 else 16) if t < 2 else ta + (0 if (t == 2 or one_b) else 16)
        total = uint32(0)
        t0 = uint32(256 * t)
        for k in range(8):
            fw = uint32(cuda.shfl_sync(FULL_MASK, tw, (t_off >> 1) + k))
            total = _fill_symbol(tab, t0, total, uint32(2 * k), fw & uint32(0xFF), lane)
            total = _fill_symbol(tab, t0, total, uint32(2 * k + 1), fw >> uint32(8), lane)
        if total != NIB_TOTAL:
            bad = True
    if bad:  # uniform: every lane read the same tables
        return E_TABLE
    if cuda.ballot_sync(FULL_MASK, x < uint32(STATE_L)) != 0:
        return E_STATE
    cuda.syncwarp(FULL_MASK)  # tables visible to the whole warp
    p0 = max(n - TAIL, 0)
    hi_a = 0 if one_a else 256
    ja = min(na, p0) // LANES  # steps whose 32 bytes are all segment A
    pos = uint32(0)
    wb = uint32(0)
    x, pos, wb, r0, r1, r2 = _decode_steps(s16, wbase, words32, tab, out_a, oa, out_b, ob, na, p0, hi_a,
                                           0, ja, True, x, pos, wb, r0, r1, r2)
    x, pos, wb, r0, r1, r2 = _decode_steps(s16, wbase, words32, tab, out_a, oa, out_b, ob, na, p0, hi_a,
                                           ja, (p0 + LANES - 1) // LANES, False, x, pos, wb, r0, r1, r2)
    if pos > words32:
        return E_OVERRUN
    # payload: the lane's last <= 3 bytes sit in its final state
    bad = (x >> uint32(24)) != uint32(1)
    i = p0 + ((lane - p0) & (LANES - 1))
    for t in range(3):
        v = (x >> uint32(8 * t)) & uint32(0xFF)
        if i < n:
            if i < na:
                out_a[oa + i] = v
            else:
                out_b[ob + i - na] = v
        elif v != 0:
            bad = True
        i += LANES
    if cuda.ballot_sync(FULL_MASK, bad) != 0 or pos != words32:
        return E_FINAL
    if words & 1 and s16[wbase + words] != 0:
        return E_PADDING
    return OK


@cuda.jit(device=True)
def warp_get_raw(s16, base, off, n, out, out_off):
    lane = cuda.laneid
    bad = False
    for i in range(lane, (n + 3) & ~3, LANES):
        v = gpu_rd8(s16, base, off + i)
        if i < n:
            out[out_off + i] = v
        elif v != 0:
            bad = True
    if cuda.ballot_sync(FULL_MASK, bad) != 0:
        return E_PADDING
    return OK


@cuda.jit(device=True)
def warp_decode_page(s16, base, nbytes, codes, codes_off, codes_cap, scales, scales_off, scales_cap, h, tab):
    """Warp-cooperative decode of one page slot: what attention calls for a sentinel page.

    s16/base/nbytes: the slot (uint16 words from word `base`, `nbytes` readable = its allocation).
    codes/scales: destinations (global or shared) with codes_cap / scales_cap bytes of room at the
    offsets. h: int64[9] per-lane scratch, filled with the header (parse_page_header). tab: this
    warp's uint32[1024] shared table. Returns a status code (warp-uniform).
    """
    err = gpu_parse_page_header(s16, base, nbytes, h)
    if err != OK:
        return err
    if h[4] > codes_cap or h[5] > scales_cap:
        return E_LENGTH
    if h[3] & F_CODED:
        return warp_decode_section(s16, base, SLOT_HEADER, h[4], True, h[5], False, h[6],
                                   codes, codes_off, scales, scales_off, tab)
    err = warp_get_raw(s16, base, SLOT_HEADER, h[4], codes, codes_off)
    if err != OK:
        return err
    return warp_get_raw(s16, base, SLOT_HEADER + ((h[4] + 3) & ~3), h[5], scales, scales_off)


RESTORE_WARPS = 4  # warps per block of the restore kernel (4 KB of shared tables each)


@cuda_kernel
def restore_pages_kernel(pool16, slot_word_off, slot_bytes, codes, scales, gbits, status):
    """Decode slots back to pages, a warp per slot.

    pool16 uint16[W] (the slot pool), slot_word_off int64[P], slot_bytes int32[P] (allocation) ->
    codes uint8[P, n_codes], scales uint8[P, n_scales], gbits uint32[P], status int32[P].
    """
    tab_all = cuda.shared.array((RESTORE_WARPS, 1024), np.uint32)
    h = cuda.local.array(9, np.int64)
    w = cuda.threadIdx.x // LANES
    p = cuda.blockIdx.x * RESTORE_WARPS + w
    if p >= slot_word_off.shape[0]:
        return  # the whole warp leaves together
    h[8] = 0
    err = warp_decode_page(pool16, slot_word_off[p], slot_bytes[p], codes[p], 0, codes.shape[1],
                           scales[p], 0, scales.shape[1], h, tab_all[w])
    if cuda.laneid == 0:
        status[p] = err
        gbits[p] = uint32(h[8]) if err == OK else uint32(0)


PTX_SIGNATURES = [
    (encode_pages_kernel, "void(uint8[:, :], uint8[:, :], uint32[:], int64, int64, int64, uint8[:, :], int32[:])"),
    (restore_pages_kernel, "void(uint16[::1], int64[::1], int32[::1], uint8[:, ::1], uint8[:, ::1], uint32[::1], int32[::1])"),
    (warp_decode_section, "int64(uint16[:], int64, int64, int64, boolean, int64, boolean, int64, "
                          "uint8[:], int64, uint8[:], int64, uint32[:])"),
    (warp_decode_page, "int64(uint16[:], int64, int64, uint8[:], int64, int64, uint8[:], int64, int64, "
                       "int64[:], uint32[:])"),
    (gpu_encode_page, "int64(uint8[:], int64, uint8[:], int64, int64, int64, int64, int64, uint8[:], int64, "
                      "int64[:], int64[:], int64[:])"),
]
