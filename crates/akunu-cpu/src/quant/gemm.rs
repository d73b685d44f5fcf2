//! The tiled product for x86-64: weights decoded once per 16-row panel, activations broadcast a
//! 32-bit word (four levels) at a time.
//!
//! Panel layout (k = row length, G = group):
//! - `q`: per 32-element chunk (8 words, 16 rows, 4 levels), chunks [`CHUNK_STRIDE`] bytes
//!   apart: word `(j, i)` of a chunk holds its levels `4j..4j+4` of row `i`, so one 64-byte load
//!   feeds 16 rows to `vpdpbusd` (or two 8-row halves to `vpmaddubsw`).
//! - `sw`, `mw`: (k/G, 16 rows) `f32`, the per-group decode of [`Format`].
//!
//! A tile of 16 rows × T tokens sums levels in `i32` per group, then adds
//! `(cvt(Σq·x) − OFF·Σx)·sw·sx + mw·s` to `f32` accumulators (the difference is of integers below
//! 2²⁴, so exact), and nothing is reduced horizontally. The groups go in the order of
//! [`super`]: the chunks of accumulator 0 (chunks 0, 8, 16, …), then those of accumulator 1,
//! and so on, each accumulator with one lane per row and added to the total as it is done.
//! A token's lanes never mix with another's, so tiles of any size give the same bits. Rows past
//! the end of the matrix are zero in the last panel and not written.

use std::arch::x86_64::*;

use rayon::prelude::*;

use super::decode::Format;
use super::fused::{fifth_bits_32, nibbles_32};
use super::{Activations, Out, SimdLevel, WeightMatrix, SLOTS};

/// Rows per panel.
const NR: usize = 16;
/// Bytes from one 32-element chunk of a panel to the next: its 512 bytes and a line of padding,
/// so that the chunks of one accumulator (every eighth) do not all fall in the same L1 sets.
const CHUNK_STRIDE: usize = 32 * NR + 64;
/// Tokens per tile with AVX-512: 8 `i32` accumulators, 8 `f32` ones and 8 totals, a weight
/// register and two scale registers fit the 32 registers.
const NT_512: usize = 8;
/// Tokens per tile with AVX2 (16 registers), over one 8-row half of the panel at a time.
const NT_256: usize = 4;

/// A 16-row panel of decoded weights; reused across panels by one task.
#[derive(Default)]
struct Panel {
    q: Vec<u8>,
    sw: Vec<f32>,
    mw: Vec<f32>,
}

impl Panel {
    /// Decodes rows `r0..r0 + 16` of `w` (rows past the end as zeros).
    #[inline(always)]
    fn pack<F: Format>(&mut self, w: &WeightMatrix, r0: usize) {
        let k = w.cols();
        let (nc, ng, per) = (k / 32, k / F::GROUP, F::BLOCK / F::GROUP);
        self.q.resize(nc * CHUNK_STRIDE, 0);
        self.sw.resize(ng * NR, 0.0);
        self.mw.resize(ng * NR, 0.0);
        let mut q = [0u8; 256];
        let (mut sw, mut mw) = ([0.0f32; 16], [0.0f32; 16]);
        for i in 0..NR {
            let r = r0 + i;
            if r >= w.rows() {
                for chunk in self.q.chunks_exact_mut(CHUNK_STRIDE) {
                    for word in chunk[..32 * NR].chunks_exact_mut(4 * NR) {
                        word[4 * i..4 * i + 4].fill(0);
                    }
                }
                for g in 0..ng {
                    self.sw[g * NR + i] = 0.0;
                    self.mw[g * NR + i] = 0.0;
                }
                continue;
            }
            for (b, block) in w.row(r).chunks_exact(F::BYTES).enumerate() {
                if F::BLOCK == 32 {
                    // SAFETY: `pack` only runs inside `pack_avx2`; `block` is one whole block.
                    (sw[0], mw[0]) = unsafe { legacy_avx2::<F>(block, &mut q) };
                } else {
                    F::decode(block, &mut q, &mut sw, &mut mw);
                }
                for (cb, levels) in q[..F::BLOCK].chunks_exact(32).enumerate() {
                    let at = (b * F::BLOCK / 32 + cb) * CHUNK_STRIDE;
                    let words = &mut self.q[at..at + 32 * NR];
                    for (dst, src) in words.chunks_exact_mut(4 * NR).zip(levels.chunks_exact(4)) {
                        dst[4 * i..4 * i + 4].copy_from_slice(src);
                    }
                }
                for g in 0..per {
                    self.sw[(b * per + g) * NR + i] = sw[g];
                    self.mw[(b * per + g) * NR + i] = mw[g];
                }
            }
        }
    }
}

/// Decodes a block of a 32-element format into `q[..32]` with AVX2, as its [`Format::decode`];
/// returns `(sw, mw)`.
///
/// # Safety
/// AVX2 and F16C must be available and `block` must be one block of `F`.
#[inline(always)]
unsafe fn legacy_avx2<F: Format>(block: &[u8], q: &mut [u8; 256]) -> (f32, f32) {
    use akunu_quant::GgmlType as T;
    assert!(block.len() >= F::BYTES && F::BLOCK == 32);
    let p = block.as_ptr();
    let half = |at: usize| {
        let bits = p.add(at).cast::<u16>().read_unaligned();
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
    };
    let nibbles = |at: usize| nibbles_32(p.add(at));
    let fifth = |at: usize| fifth_bits_32(p.add(at));
    let (levels, sw, mw) = match F::TY {
        T::Q4_0 => (nibbles(2), half(0), 0.0),
        T::Q4_1 => (nibbles(4), half(0), half(2)),
        T::Q5_0 => (_mm256_or_si256(nibbles(6), fifth(2)), half(0), 0.0),
        T::Q5_1 => (_mm256_or_si256(nibbles(8), fifth(4)), half(0), half(2)),
        T::Q8_0 => (
            _mm256_xor_si256(_mm256_loadu_si256(p.add(2).cast()), _mm256_set1_epi8(-128)),
            half(0),
            0.0,
        ),
        T::IQ4_NL => {
            let table = _mm_loadu_si128(super::decode::KVALUES_U8.as_ptr().cast());
            let table = _mm256_set_m128i(table, table);
            (_mm256_shuffle_epi8(table, nibbles(2)), half(0), 0.0)
        }
        _ => unreachable!("32-element formats only"),
    };
    _mm256_storeu_si256(q.as_mut_ptr().cast(), levels);
    (sw, mw)
}

/// The whole product, panel by panel in parallel. `level` is an available x86 level.
pub(super) fn matmul<F: Format>(level: SimdLevel, w: &WeightMatrix, x: &Activations, out: Out) {
    let panels = w.rows().div_ceil(NR);
    (0..panels)
        .into_par_iter()
        .for_each_init(Panel::default, |p, pi| {
            let r0 = pi * NR;
            let nr = (w.rows() - r0).min(NR);
            // SAFETY: the x86 levels include AVX2.
            unsafe { pack_avx2::<F>(p, w, r0) };
            let mut tile = [[0.0f32; NR]; NT_512];
            let mut t0 = 0;
            while t0 < x.m {
                let n = match level {
                    // SAFETY: the level was checked available by `matmul_with`; the panel was
                    // packed for `x.k` columns and `t0 + n ≤ x.m`.
                    SimdLevel::Avx512Vnni => unsafe { tiles_512::<F>(p, x, t0, &mut tile) },
                    // SAFETY: as above.
                    _ => unsafe { tiles_256::<F>(p, x, t0, &mut tile) },
                };
                for (t, vals) in tile[..n].iter().enumerate() {
                    // SAFETY: this task owns rows `r0..r0 + nr` of every output row.
                    unsafe { out.put(t0 + t, r0, &vals[..nr]) };
                }
                t0 += n;
            }
        });
}

/// [`Panel::pack`] compiled for AVX2, where the decoders' byte loops vectorize.
///
/// # Safety
/// AVX2, FMA and F16C must be available.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_avx2<F: Format>(p: &mut Panel, w: &WeightMatrix, r0: usize) {
    p.pack::<F>(w, r0);
}

/// Computes the next tile of up to [`NT_512`] tokens from `t0`; returns how many.
///
/// # Safety
/// AVX-512 F/BW/VL and VNNI must be available, `p` packed for rows of `x.k`, and `t0 < x.m`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tiles_512<F: Format>(
    p: &Panel,
    x: &Activations,
    t0: usize,
    tile: &mut [[f32; NR]; NT_512],
) -> usize {
    let n = (x.m - t0).min(NT_512);
    match n {
        8 => tile_512::<F, 8>(p, x, t0, tile),
        7 => tile_512::<F, 7>(p, x, t0, tile),
        6 => tile_512::<F, 6>(p, x, t0, tile),
        5 => tile_512::<F, 5>(p, x, t0, tile),
        4 => tile_512::<F, 4>(p, x, t0, tile),
        3 => tile_512::<F, 3>(p, x, t0, tile),
        2 => tile_512::<F, 2>(p, x, t0, tile),
        _ => tile_512::<F, 1>(p, x, t0, tile),
    }
    n
}

/// 16 rows × `T` tokens from `t0`.
///
/// # Safety
/// As [`tiles_512`], with `t0 + T ≤ x.m`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile_512<F: Format, const T: usize>(
    p: &Panel,
    x: &Activations,
    t0: usize,
    tile: &mut [[f32; NR]; NT_512],
) {
    let k = x.k;
    let (ng, gw) = (k / F::GROUP, F::GROUP / 4);
    assert!(x.q.len() >= (t0 + T) * k && x.sx.len() >= (t0 + T) * ng);
    assert!(x.xsum.len() >= (t0 + T) * ng && x.s.len() >= (t0 + T) * ng);
    assert!(p.q.len() >= k / 32 * CHUNK_STRIDE && p.sw.len() >= ng * NR && p.mw.len() >= ng * NR);
    // Raw pointers: slices would take twice the general registers, which the tile runs short of.
    let xq: [*const u8; T] = std::array::from_fn(|t| x.q.as_ptr().add((t0 + t) * k).cast());
    let sx: [*const f32; T] = std::array::from_fn(|t| x.sx.as_ptr().add((t0 + t) * ng));
    let s: [*const f32; T] = std::array::from_fn(|t| x.s.as_ptr().add((t0 + t) * ng));
    let xsum: [*const f32; T] = std::array::from_fn(|t| x.xsum.as_ptr().add((t0 + t) * ng));
    let qp = p.q.as_ptr();
    let off = _mm512_set1_ps(f32::from(F::OFF));
    let mut total = [_mm512_setzero_ps(); T];
    let (nc, per) = (k / 32, 32 / F::GROUP);
    for slot in 0..SLOTS {
        let mut accf = [_mm512_setzero_ps(); T];
        for c in (slot..nc).step_by(SLOTS) {
            for g in c * per..(c + 1) * per {
                let mut acci = [_mm512_setzero_si512(); T];
                let words = qp.add(c * CHUNK_STRIDE + (g - c * per) * gw * 4 * NR);
                for j in 0..gw {
                    let w = _mm512_loadu_si512(words.add(j * 4 * NR).cast());
                    for t in 0..T {
                        let word = xq[t]
                            .add(g * F::GROUP + 4 * j)
                            .cast::<i32>()
                            .read_unaligned();
                        acci[t] = _mm512_dpbusd_epi32(acci[t], w, _mm512_set1_epi32(word));
                    }
                }
                let swv = _mm512_loadu_ps(p.sw.as_ptr().add(g * NR));
                let mwv = _mm512_loadu_ps(p.mw.as_ptr().add(g * NR));
                for t in 0..T {
                    let mut dot = _mm512_cvtepi32_ps(acci[t]);
                    if F::OFF != 0 {
                        dot = _mm512_fnmadd_ps(off, _mm512_set1_ps(*xsum[t].add(g)), dot);
                    }
                    let scale = _mm512_mul_ps(swv, _mm512_set1_ps(*sx[t].add(g)));
                    accf[t] = _mm512_fmadd_ps(dot, scale, accf[t]);
                    if F::HAS_MIN {
                        accf[t] = _mm512_fmadd_ps(mwv, _mm512_set1_ps(*s[t].add(g)), accf[t]);
                    }
                }
            }
        }
        for (total, accf) in total.iter_mut().zip(accf) {
            *total = if slot == 0 {
                accf
            } else {
                _mm512_add_ps(*total, accf)
            };
        }
    }
    for (tile, total) in tile.iter_mut().zip(total) {
        _mm512_storeu_ps(tile.as_mut_ptr(), total);
    }
}

/// Computes the next tile of up to [`NT_256`] tokens from `t0`, both panel halves; returns how
/// many.
///
/// # Safety
/// AVX2 and FMA must be available, `p` packed for rows of `x.k`, and `t0 < x.m`.
#[target_feature(enable = "avx2,fma")]
unsafe fn tiles_256<F: Format>(
    p: &Panel,
    x: &Activations,
    t0: usize,
    tile: &mut [[f32; NR]; NT_512],
) -> usize {
    let n = (x.m - t0).min(NT_256);
    for half in 0..2 {
        match n {
            4 => tile_256::<F, 4>(p, x, t0, half, tile),
            3 => tile_256::<F, 3>(p, x, t0, half, tile),
            2 => tile_256::<F, 2>(p, x, t0, half, tile),
            _ => tile_256::<F, 1>(p, x, t0, half, tile),
        }
    }
    n
}

/// Rows `8·half..8·half + 8` of the panel × `T` tokens from `t0`.
///
/// `vpmaddubsw` saturates pairs above `i16`, so levels are at most 127 here; wide formats (whose
/// offset is 128) are shifted to signed `q − 128` and multiplied by the sign trick (`|w|` times
/// `x` with the sign of `w`), which leaves no offset to correct.
///
/// # Safety
/// As [`tiles_256`], with `t0 + T ≤ x.m`.
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_256<F: Format, const T: usize>(
    p: &Panel,
    x: &Activations,
    t0: usize,
    half: usize,
    tile: &mut [[f32; NR]; NT_512],
) {
    let k = x.k;
    let (ng, gw) = (k / F::GROUP, F::GROUP / 4);
    assert!(x.q.len() >= (t0 + T) * k && x.sx.len() >= (t0 + T) * ng);
    assert!(x.xsum.len() >= (t0 + T) * ng && x.s.len() >= (t0 + T) * ng);
    assert!(p.q.len() >= k / 32 * CHUNK_STRIDE && p.sw.len() >= ng * NR && p.mw.len() >= ng * NR);
    // Raw pointers: slices would take twice the general registers, which the tile runs short of.
    let xq: [*const u8; T] = std::array::from_fn(|t| x.q.as_ptr().add((t0 + t) * k).cast());
    let sx: [*const f32; T] = std::array::from_fn(|t| x.sx.as_ptr().add((t0 + t) * ng));
    let s: [*const f32; T] = std::array::from_fn(|t| x.s.as_ptr().add((t0 + t) * ng));
    let xsum: [*const f32; T] = std::array::from_fn(|t| x.xsum.as_ptr().add((t0 + t) * ng));
    let qp = p.q.as_ptr().add(32 * half);
    let off = _mm256_set1_ps(f32::from(F::OFF));
    let ones = _mm256_set1_epi16(1);
    let flip = _mm256_set1_epi8(-128);
    let mut total = [_mm256_setzero_ps(); T];
    let (nc, per) = (k / 32, 32 / F::GROUP);
    for slot in 0..SLOTS {
        let mut accf = [_mm256_setzero_ps(); T];
        for c in (slot..nc).step_by(SLOTS) {
            for g in c * per..(c + 1) * per {
                let mut acci = [_mm256_setzero_si256(); T];
                let words = qp.add(c * CHUNK_STRIDE + (g - c * per) * gw * 4 * NR);
                for j in 0..gw {
                    let w = _mm256_loadu_si256(words.add(j * 4 * NR).cast());
                    let (wa, ws) = if F::WIDE {
                        let ws = _mm256_xor_si256(w, flip);
                        (_mm256_abs_epi8(ws), ws)
                    } else {
                        (w, w)
                    };
                    for t in 0..T {
                        let word = xq[t]
                            .add(g * F::GROUP + 4 * j)
                            .cast::<i32>()
                            .read_unaligned();
                        let mut xb = _mm256_set1_epi32(word);
                        if F::WIDE {
                            xb = _mm256_sign_epi8(xb, ws);
                        }
                        let pairs = _mm256_maddubs_epi16(wa, xb);
                        acci[t] = _mm256_add_epi32(acci[t], _mm256_madd_epi16(pairs, ones));
                    }
                }
                let swv = _mm256_loadu_ps(p.sw.as_ptr().add(g * NR + 8 * half));
                let mwv = _mm256_loadu_ps(p.mw.as_ptr().add(g * NR + 8 * half));
                for t in 0..T {
                    let mut dot = _mm256_cvtepi32_ps(acci[t]);
                    if F::OFF != 0 && !F::WIDE {
                        dot = _mm256_fnmadd_ps(off, _mm256_set1_ps(*xsum[t].add(g)), dot);
                    }
                    let scale = _mm256_mul_ps(swv, _mm256_set1_ps(*sx[t].add(g)));
                    accf[t] = _mm256_fmadd_ps(dot, scale, accf[t]);
                    if F::HAS_MIN {
                        accf[t] = _mm256_fmadd_ps(mwv, _mm256_set1_ps(*s[t].add(g)), accf[t]);
                    }
                }
            }
        }
        for (total, accf) in total.iter_mut().zip(accf) {
            *total = if slot == 0 {
                accf
            } else {
                _mm256_add_ps(*total, accf)
            };
        }
    }
    for (tile, total) in tile.iter_mut().zip(total) {
        _mm256_storeu_ps(tile[8 * half..].as_mut_ptr(), total);
    }
}
