//! One-pass row dots for small `m` on the hot types: a row's blocks are unpacked in registers and
//! multiplied with each token, without a decode buffer. With one token the product is bound by
//! memory bandwidth (every weight byte is read once), so these kernels only have to keep up
//! with it; rows are split over the pool in chunks.
//!
//! A row is read in batches of eight 32-element chunks (one k-quant block, or eight blocks of the
//! others). Each chunk's byte products land in eight `i32` lanes; a transposing tree of exact
//! integer additions reduces the batch's eight vectors to one with a chunk per lane, which is
//! then scaled and added to a vector of eight accumulators: chunk `c` to lane `c mod 8`. That
//! is the order of [`super`], which `gemm` follows with one lane per row, so a (row, token) pair
//! gets the same bits whichever kernel the batch size picks. The last batch of a row may hold
//! fewer chunks; its missing lanes are zero and add nothing.

use std::arch::x86_64::*;
use std::ops::Range;

use akunu_quant::GgmlType;
use rayon::prelude::*;

use super::decode::{self, Format};
use super::{split, Activations, Out, SimdLevel, WeightMatrix, SLOTS};

/// Up to this many tokens, a row is dotted with each token while its bytes are in registers or
/// L1; beyond, the panel product of `gemm`, which decodes each weight once for all tokens, is
/// faster (on Zen 4: from 5 or 6 tokens on for Q8_0 and Q5_0, 7 or 8 for the k-quants). Both
/// give the same bits, so this only moves time.
const MAX_M: usize = 5;

/// Runs the product if `F` has a fused kernel at `level` and `m` is small; returns whether it
/// did.
pub(super) fn matmul<F: Format>(
    level: SimdLevel,
    w: &WeightMatrix,
    x: &Activations,
    out: Out,
) -> bool {
    if x.m > MAX_M {
        return false;
    }
    match F::TY {
        GgmlType::Q8_0 => run::<decode::Q8_0>(level, w, x, out),
        GgmlType::Q5_0 => run::<decode::Q5_0>(level, w, x, out),
        GgmlType::Q4_K => run::<decode::Q4_K>(level, w, x, out),
        GgmlType::Q6_K => run::<decode::Q6_K>(level, w, x, out),
        _ => return false,
    }
    true
}

fn run<F: Unpack>(level: SimdLevel, w: &WeightMatrix, x: &Activations, out: Out) {
    let ranges: Vec<_> = split(w.rows(), 16).collect();
    ranges.into_par_iter().for_each(|rows| {
        let n = rows.len();
        // vals[t·n + i] for row rows.start + i.
        let mut vals = vec![0.0f32; x.m * n];
        // SAFETY: the x86 levels include AVX2, FMA and F16C, and `Avx512Vnni` the AVX-512
        // features (checked by `matmul_with`); `rows` are rows of `w`, `m ≤ MAX_M`, the
        // activations were prepared for `F` with `w.cols()` columns, and `vals` holds `m·n`.
        unsafe {
            match level {
                SimdLevel::Avx512Vnni => range_vnni::<F>(w, rows.clone(), x, &mut vals),
                _ => range_avx2::<F>(w, rows.clone(), x, &mut vals),
            }
        }
        for (t, v) in vals.chunks_exact(n).enumerate() {
            // SAFETY: this task owns rows `rows` of every output row.
            unsafe { out.put(t, rows.start, v) };
        }
    });
}

/// [`range`] with `vpmaddubsw` and `vpmaddwd` for the byte products.
///
/// # Safety
/// AVX2, FMA and F16C; as [`range`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn range_avx2<F: Unpack>(
    w: &WeightMatrix,
    rows: Range<usize>,
    x: &Activations,
    vals: &mut [f32],
) {
    match x.m {
        1 => range::<F, 1, false>(w, rows, x, vals),
        2 => range::<F, 2, false>(w, rows, x, vals),
        3 => range::<F, 3, false>(w, rows, x, vals),
        4 => range::<F, 4, false>(w, rows, x, vals),
        _ => range::<F, 5, false>(w, rows, x, vals),
    }
}

/// [`range`] with `vpdpbusd` for the byte products.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; as [`range`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn range_vnni<F: Unpack>(
    w: &WeightMatrix,
    rows: Range<usize>,
    x: &Activations,
    vals: &mut [f32],
) {
    match x.m {
        1 => range::<F, 1, true>(w, rows, x, vals),
        2 => range::<F, 2, true>(w, rows, x, vals),
        3 => range::<F, 3, true>(w, rows, x, vals),
        4 => range::<F, 4, true>(w, rows, x, vals),
        _ => range::<F, 5, true>(w, rows, x, vals),
    }
}

/// Rows `rows` of `w` times the `T` tokens of `x`, into `vals[t·n + i]` for row
/// `rows.start + i` (`n` rows).
///
/// # Safety
/// The features of the caller's level; `rows` within `w`, `T = x.m`, the activations prepared
/// for `F` with `w.cols()` columns, and `vals.len() ≥ T·n`.
#[inline(always)]
unsafe fn range<F: Unpack, const T: usize, const VNNI: bool>(
    w: &WeightMatrix,
    rows: Range<usize>,
    x: &Activations,
    vals: &mut [f32],
) {
    let (k, n) = (x.k, rows.len());
    let ng = k / F::GROUP;
    assert!(rows.end <= w.rows() && x.m == T && k == w.cols() && k % F::BLOCK == 0);
    assert!(x.q.len() >= T * k && vals.len() >= T * n);
    assert!(x.sx.len() >= T * ng && x.xsum.len() >= T * ng && x.s.len() >= T * ng);
    let tokens: [Token; T] = std::array::from_fn(|t| Token {
        q: x.q[t * k..].as_ptr(),
        sx: x.sx[t * ng..].as_ptr(),
        xsum: x.xsum[t * ng..].as_ptr(),
        s: x.s[t * ng..].as_ptr(),
    });
    for (i, r) in rows.enumerate() {
        let row = w.row(r).as_ptr();
        let mut acc = [_mm256_setzero_ps(); T];
        for c0 in (0..k / 32).step_by(SLOTS) {
            let len = (k / 32 - c0).min(SLOTS);
            // A batch starts on a block boundary.
            let blk = row.add(c0 * 32 / F::BLOCK * F::BYTES);
            let mut prods = [[_mm256_setzero_si256(); SLOTS]; T];
            for j in 0..len {
                let q = F::chunk(blk, j);
                for (p, tok) in prods.iter_mut().zip(&tokens) {
                    let xv = _mm256_loadu_si256(tok.q.add(32 * (c0 + j)).cast());
                    p[j] = if F::SIGNED {
                        bytes_dot::<VNNI>(_mm256_abs_epi8(q), _mm256_sign_epi8(xv, q))
                    } else {
                        bytes_dot::<VNNI>(q, xv)
                    };
                }
            }
            let scales = F::scales(blk, len);
            for ((a, p), tok) in acc.iter_mut().zip(&prods).zip(&tokens) {
                let (lo, hi) = transpose_sum(p);
                *a = if F::GROUP == 32 {
                    let sums = _mm256_add_epi32(lo, hi);
                    let act = tok.groups(c0, len);
                    step::<F>(*a, sums, scales.sw[0], scales.mw[0], &act)
                } else {
                    // Lanes of `lo` hold the chunks' first groups, of `hi` their second.
                    let (even, odd) = tok.groups_16(2 * c0);
                    let a = step::<F>(*a, lo, scales.sw[0], scales.mw[0], &even);
                    step::<F>(a, hi, scales.sw[1], scales.mw[1], &odd)
                };
            }
        }
        for (t, a) in acc.iter().enumerate() {
            vals[t * n + i] = ordered_sum(*a);
        }
    }
}

/// A token's levels and per-group values.
struct Token {
    q: *const i8,
    sx: *const f32,
    xsum: *const f32,
    s: *const f32,
}

/// Per-group values of eight groups, one per lane (zero in unused lanes).
struct Groups {
    sx: __m256,
    xsum: __m256,
    s: __m256,
}

impl Token {
    /// Groups `g0..g0 + len` (`len ≤ 8`).
    #[inline(always)]
    unsafe fn groups(&self, g0: usize, len: usize) -> Groups {
        let mask = _mm256_cmpgt_epi32(
            _mm256_set1_epi32(len as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        );
        Groups {
            sx: _mm256_maskload_ps(self.sx.add(g0), mask),
            xsum: _mm256_maskload_ps(self.xsum.add(g0), mask),
            s: _mm256_maskload_ps(self.s.add(g0), mask),
        }
    }

    /// The even and the odd groups of `g0..g0 + 16`.
    #[inline(always)]
    unsafe fn groups_16(&self, g0: usize) -> (Groups, Groups) {
        let (sx, xsum, s) = (
            deinterleave(self.sx.add(g0)),
            deinterleave(self.xsum.add(g0)),
            deinterleave(self.s.add(g0)),
        );
        (
            Groups {
                sx: sx.0,
                xsum: xsum.0,
                s: s.0,
            },
            Groups {
                sx: sx.1,
                xsum: xsum.1,
                s: s.1,
            },
        )
    }
}

/// The even and the odd values of the sixteen at `p`.
#[inline(always)]
unsafe fn deinterleave(p: *const f32) -> (__m256, __m256) {
    let (a, b) = (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)));
    // Within each 128-bit half: two lanes of `a`, two of `b`; then the 64-bit pairs reordered.
    let even = _mm256_castps_pd(_mm256_shuffle_ps(a, b, 0b10_00_10_00));
    let odd = _mm256_castps_pd(_mm256_shuffle_ps(a, b, 0b11_01_11_01));
    (
        _mm256_castpd_ps(_mm256_permute4x64_pd(even, 0b11_01_10_00)),
        _mm256_castpd_ps(_mm256_permute4x64_pd(odd, 0b11_01_10_00)),
    )
}

/// One group per lane added to its accumulator lane in the canonical order:
/// `acc = fma(Σ(q − OFF)·x, sw·sx, acc)`, then `acc = fma(mw, s, acc)` for formats with a min.
#[inline(always)]
unsafe fn step<F: Unpack>(
    acc: __m256,
    isum: __m256i,
    sw: __m256,
    mw: __m256,
    x: &Groups,
) -> __m256 {
    let mut dot = _mm256_cvtepi32_ps(isum);
    if F::OFF != 0 && !F::SIGNED {
        dot = _mm256_fnmadd_ps(_mm256_set1_ps(f32::from(F::OFF)), x.xsum, dot);
    }
    let acc = _mm256_fmadd_ps(dot, _mm256_mul_ps(sw, x.sx), acc);
    if F::HAS_MIN {
        _mm256_fmadd_ps(mw, x.s, acc)
    } else {
        acc
    }
}

/// `a0 + a1 + … + a7`, added in that order, as `gemm` adds its accumulators.
#[inline(always)]
unsafe fn ordered_sum(a: __m256) -> f32 {
    let mut lanes = [0.0f32; SLOTS];
    _mm256_storeu_ps(lanes.as_mut_ptr(), a);
    lanes[1..].iter().fold(lanes[0], |sum, &v| sum + v)
}

/// Per-group scales and mins of a batch, one group per lane: `[0]` alone for 32-element groups,
/// the chunks' first groups in `[0]` and their second in `[1]` for 16-element groups.
struct Scales {
    sw: [__m256; 2],
    mw: [__m256; 2],
}

/// A format whose blocks the kernels unpack in registers, 32 elements (a chunk) at a time.
trait Unpack: Format {
    /// Whether chunk levels are the signed `q − OFF` (multiplied by the sign trick: `|w|` times
    /// `x` with the sign of `w`) rather than the unsigned `q` with the offset taken off through
    /// the group level sums.
    const SIGNED: bool;

    /// The levels of elements `32c..32c + 32` counted from the start of the block at `blk`
    /// (for 32-element formats, of the `c`-th block from there).
    unsafe fn chunk(blk: *const u8, c: usize) -> __m256i;

    /// The scales (and mins) of the groups of the `len` chunks from the block at `blk`, zero in
    /// the lanes of missing chunks.
    unsafe fn scales(blk: *const u8, len: usize) -> Scales;
}

/// The `f32` values of the `f16` scales at the start of `len ≤ 8` blocks of `bytes` bytes from
/// `blk`, one per lane (zero past `len`).
#[inline(always)]
unsafe fn block_scales(blk: *const u8, bytes: usize, len: usize) -> __m256 {
    let h = |j: usize| {
        if j < len {
            blk.add(bytes * j).cast::<i16>().read_unaligned()
        } else {
            0
        }
    };
    _mm256_cvtph_ps(_mm_setr_epi16(
        h(0),
        h(1),
        h(2),
        h(3),
        h(4),
        h(5),
        h(6),
        h(7),
    ))
}

impl Unpack for decode::Q8_0 {
    const SIGNED: bool = true;

    #[inline(always)]
    unsafe fn chunk(blk: *const u8, c: usize) -> __m256i {
        _mm256_loadu_si256(blk.add(34 * c + 2).cast())
    }

    #[inline(always)]
    unsafe fn scales(blk: *const u8, len: usize) -> Scales {
        let zero = _mm256_setzero_ps();
        Scales {
            sw: [block_scales(blk, 34, len), zero],
            mw: [zero; 2],
        }
    }
}

impl Unpack for decode::Q5_0 {
    const SIGNED: bool = false;

    #[inline(always)]
    unsafe fn chunk(blk: *const u8, c: usize) -> __m256i {
        let blk = blk.add(22 * c);
        _mm256_or_si256(nibbles_32(blk.add(6)), fifth_bits_32(blk.add(2)))
    }

    #[inline(always)]
    unsafe fn scales(blk: *const u8, len: usize) -> Scales {
        let zero = _mm256_setzero_ps();
        Scales {
            sw: [block_scales(blk, 22, len), zero],
            mw: [zero; 2],
        }
    }
}

impl Unpack for decode::Q4_K {
    const SIGNED: bool = false;

    /// Per 64 elements, 32 bytes: low nibbles first, then high.
    #[inline(always)]
    unsafe fn chunk(blk: *const u8, c: usize) -> __m256i {
        let bits = _mm256_loadu_si256(blk.add(16 + 32 * (c / 2)).cast());
        let bits = if c.is_multiple_of(2) {
            bits
        } else {
            _mm256_srli_epi16(bits, 4)
        };
        _mm256_and_si256(bits, _mm256_set1_epi8(0x0F))
    }

    /// `sw = d·sc`, `mw = −dmin·m`, as `k4_like` decodes them.
    #[inline(always)]
    unsafe fn scales(blk: *const u8, _: usize) -> Scales {
        let sc = k4_scales(&*blk.add(4).cast::<[u8; 12]>());
        let sc = _mm_loadu_si128(sc.as_ptr().cast());
        let (d, dmin) = (f16_at(blk), f16_at(blk.add(2)));
        let scales = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc));
        let mins = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sc, 8)));
        let zero = _mm256_setzero_ps();
        Scales {
            sw: [_mm256_mul_ps(_mm256_set1_ps(d), scales), zero],
            mw: [_mm256_mul_ps(_mm256_set1_ps(-dmin), mins), zero],
        }
    }
}

impl Unpack for decode::Q6_K {
    const SIGNED: bool = false;

    /// Per 128 elements (`n`), 64 bytes of low nibbles and 32 bytes of high bit pairs: chunk
    /// `sub` takes the low or high nibbles of one 32-byte half and bit pair `sub` of `qh`.
    #[inline(always)]
    unsafe fn chunk(blk: *const u8, c: usize) -> __m256i {
        let (n, sub) = (c / 4, c % 4);
        let ql = _mm256_loadu_si256(blk.add(64 * n + 32 * (sub % 2)).cast());
        let qh = _mm256_loadu_si256(blk.add(128 + 32 * n).cast());
        let low = if sub < 2 {
            ql
        } else {
            _mm256_srli_epi16(ql, 4)
        };
        let high = match sub {
            0 => _mm256_slli_epi16(qh, 4),
            1 => _mm256_slli_epi16(qh, 2),
            2 => qh,
            _ => _mm256_srli_epi16(qh, 2),
        };
        _mm256_or_si256(
            _mm256_and_si256(low, _mm256_set1_epi8(0x0F)),
            _mm256_and_si256(high, _mm256_set1_epi8(0x30)),
        )
    }

    /// `sw = d·sc` with the sixteen signed 8-bit scales at byte 192 (even ones first) and `d`
    /// at byte 208.
    #[inline(always)]
    unsafe fn scales(blk: *const u8, _: usize) -> Scales {
        let sc = _mm_loadu_si128(blk.add(192).cast());
        let sc = _mm_shuffle_epi8(
            sc,
            _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15),
        );
        let d = _mm256_set1_ps(f16_at(blk.add(208)));
        let even = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc));
        let odd = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)));
        Scales {
            sw: [_mm256_mul_ps(d, even), _mm256_mul_ps(d, odd)],
            mw: [_mm256_setzero_ps(); 2],
        }
    }
}

/// The `f32` value of the `f16` at `p`.
#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    let bits = p.cast::<u16>().read_unaligned();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// The eight 6-bit scales (bytes 0..8) and mins (bytes 8..16) of a Q4_K/Q5_K `scales` field:
/// sub-blocks 0..4 hold theirs in the low six bits of bytes `j` and `j + 4`, sub-blocks 4..8 in
/// the nibbles of bytes 8..12 plus the top two bits of bytes 0..8.
#[inline(always)]
fn k4_scales(s: &[u8; 12]) -> [u8; 16] {
    let word = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (w0, w1, w2) = (word(0), word(1), word(2));
    let low6 = 0x3F3F_3F3F;
    let nib = 0x0F0F_0F0F;
    let top2 = 0x0303_0303;
    let out = [
        w0 & low6,
        (w2 & nib) | (((w0 >> 6) & top2) << 4),
        w1 & low6,
        ((w2 >> 4) & nib) | (((w1 >> 6) & top2) << 4),
    ];
    let mut b = [0u8; 16];
    for (dst, w) in b.chunks_exact_mut(4).zip(out) {
        dst.copy_from_slice(&w.to_le_bytes());
    }
    b
}

/// Unsigned bytes `a` times signed bytes `b`, summed in fours into eight `i32` lanes. The pairs
/// of `vpmaddubsw` stay below `i16::MAX` because every `a` here is at most 128 and `|b| ≤ 127`.
#[inline(always)]
unsafe fn bytes_dot<const VNNI: bool>(a: __m256i, b: __m256i) -> __m256i {
    if VNNI {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b)
    } else {
        _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1))
    }
}

/// Eight vectors of eight `i32` lanes to their sums, one lane per vector: of lanes 0..4
/// (elements 0..16 of a chunk) and of lanes 4..8 (16..32). The additions are exact, so their
/// tree does not matter; unpacks and adds cost less than `vphaddd` on some cores.
#[inline(always)]
unsafe fn transpose_sum(v: &[__m256i; SLOTS]) -> (__m256i, __m256i) {
    let (p01, p23) = (sum_pairs(v[0], v[1]), sum_pairs(v[2], v[3]));
    let (p45, p67) = (sum_pairs(v[4], v[5]), sum_pairs(v[6], v[7]));
    // Lanes 0..4 of four vectors in the low half, lanes 4..8 in the high half.
    let q0123 = _mm256_add_epi32(
        _mm256_unpacklo_epi64(p01, p23),
        _mm256_unpackhi_epi64(p01, p23),
    );
    let q4567 = _mm256_add_epi32(
        _mm256_unpacklo_epi64(p45, p67),
        _mm256_unpackhi_epi64(p45, p67),
    );
    (
        _mm256_permute2x128_si256(q0123, q4567, 0x20),
        _mm256_permute2x128_si256(q0123, q4567, 0x31),
    )
}

/// Lanes `0 + 2` and `1 + 3` of `a` and of `b`, interleaved, in each 128-bit half.
#[inline(always)]
unsafe fn sum_pairs(a: __m256i, b: __m256i) -> __m256i {
    _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b))
}

/// The 32 nibbles of a Q4_0-style `qs` (16 bytes) in element order: low nibbles then high.
#[inline(always)]
pub(super) unsafe fn nibbles_32(qs: *const u8) -> __m256i {
    let b = _mm_loadu_si128(qs.cast());
    let m4 = _mm_set1_epi8(0x0F);
    _mm256_set_m128i(
        _mm_and_si128(_mm_srli_epi16(b, 4), m4),
        _mm_and_si128(b, m4),
    )
}

/// 16 in byte `j` where bit `j` of the `u32` at `qh` is set: the bits are spread to bytes by a
/// shuffle (byte `j` gets `qh` byte `j / 8`) and an OR with every bit but `j % 8` set, which is
/// all ones exactly when bit `j` is set.
#[inline(always)]
pub(super) unsafe fn fifth_bits_32(qh: *const u8) -> __m256i {
    let qh = qh.cast::<i32>().read_unaligned();
    let spread = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3,
        3, 3,
    );
    let bits = _mm256_or_si256(
        _mm256_shuffle_epi8(_mm256_set1_epi32(qh), spread),
        _mm256_set1_epi64x(0x7FBF_DFEF_F7FB_FDFE),
    );
    _mm256_and_si256(
        _mm256_cmpeq_epi8(bits, _mm256_set1_epi8(-1)),
        _mm256_set1_epi8(16),
    )
}
