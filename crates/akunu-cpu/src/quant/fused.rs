//! One-pass row dots for small `m` on the hot types: a block is unpacked in registers, multiplied
//! with the activation levels and scaled, without a decode buffer. With one token the product is
//! bound by memory bandwidth (every weight byte is read once), so these kernels only have to keep
//! up with it; rows are split over the pool in chunks.

use std::arch::x86_64::*;

use akunu_quant::GgmlType;
use rayon::prelude::*;

use super::decode::Format;
use super::{split, Activations, Out, SimdLevel, WeightMatrix};

/// Up to this many tokens, a row is dotted token by token (its bytes stay in L1 meanwhile);
/// beyond, the panel product of `gemm`, which decodes each weight once, is faster.
const MAX_M: usize = 3;

/// Dots one weight row with one activation row: `(row bytes, levels, sx, xsum, s) -> value`,
/// with the activation groups of the weight type.
type RowDot = unsafe fn(&[u8], &[i8], &[f32], &[f32], &[f32]) -> f32;

fn kernel(ty: GgmlType, level: SimdLevel) -> Option<RowDot> {
    match (ty, level) {
        (GgmlType::Q8_0, SimdLevel::Avx512Vnni) => Some(q8_0_512),
        (GgmlType::Q8_0, SimdLevel::Avx2) => Some(q8_0_256),
        (GgmlType::Q5_0, SimdLevel::Avx512Vnni) => Some(q5_0_512),
        (GgmlType::Q5_0, SimdLevel::Avx2) => Some(q5_0_256),
        // The k-quants multiply by their integer sub-scales in `vpmaddwd`, which the AVX2 kernel
        // already does as well as VNNI would.
        (GgmlType::Q4_K, SimdLevel::Avx512Vnni | SimdLevel::Avx2) => Some(q4_k_256),
        (GgmlType::Q6_K, SimdLevel::Avx512Vnni | SimdLevel::Avx2) => Some(q6_k_256),
        _ => None,
    }
}

/// Runs the product if `F` has a fused kernel at `level` and `m` is small; returns whether it
/// did.
pub(super) fn matmul<F: Format>(
    level: SimdLevel,
    w: &WeightMatrix,
    x: &Activations,
    out: Out,
) -> bool {
    let Some(dot) = kernel(F::TY, level) else {
        return false;
    };
    let (m, k) = (x.m, x.k);
    if m > MAX_M {
        return false;
    }
    let ng = k / F::GROUP;
    let ranges: Vec<_> = split(w.rows(), 16).collect();
    ranges.into_par_iter().for_each(|rows| {
        let n = rows.len();
        let mut vals = vec![0.0f32; m * n];
        for (i, r) in rows.clone().enumerate() {
            let row = w.row(r);
            for t in 0..m {
                let groups = t * ng..(t + 1) * ng;
                let (xq, sx, xsum, s) = (
                    &x.q[t * k..(t + 1) * k],
                    &x.sx[groups.clone()],
                    &x.xsum[groups.clone()],
                    &x.s[groups],
                );
                // SAFETY: the kernel was chosen for an available level, and the row, levels and
                // group arrays all describe `k` elements of `F`.
                vals[t * n + i] = unsafe { dot(row, xq, sx, xsum, s) };
            }
        }
        for (t, v) in vals.chunks_exact(n).enumerate() {
            // SAFETY: this task owns rows `rows` of every output row.
            unsafe { out.put(t, rows.start, v) };
        }
    });
    true
}

/// The `f32` value of `f16` bits at `p`.
#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    let bits = p.cast::<u16>().read_unaligned();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

#[inline(always)]
unsafe fn hsum_256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Q8_0 × Q8_0, four blocks per step into independent accumulators. The signed weights are
/// multiplied as `|w|` (unsigned) times `x` with the sign of `w`.
///
/// # Safety
/// AVX-512 VL/VNNI and F16C; `row` is `sx.len()` Q8_0 blocks and `xq` as many 32-level blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q8_0_512(row: &[u8], xq: &[i8], sx: &[f32], _: &[f32], _: &[f32]) -> f32 {
    let nb = sx.len();
    assert!(row.len() >= nb * 34 && xq.len() >= nb * 32);
    let (rp, xp) = (row.as_ptr(), xq.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let block = |b: usize, acc: __m256| {
        let w = _mm256_loadu_si256(rp.add(34 * b + 2).cast());
        let xv = _mm256_loadu_si256(xp.add(32 * b).cast());
        let dot = _mm256_dpbusd_epi32(
            _mm256_setzero_si256(),
            _mm256_abs_epi8(w),
            _mm256_sign_epi8(xv, w),
        );
        let d = _mm256_set1_ps(f16_at(rp.add(34 * b)) * sx[b]);
        _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), d, acc)
    };
    let mut b = 0;
    while b + 4 <= nb {
        for (u, a) in acc.iter_mut().enumerate() {
            *a = block(b + u, *a);
        }
        b += 4;
    }
    while b < nb {
        acc[0] = block(b, acc[0]);
        b += 1;
    }
    hsum_256(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ))
}

/// Q8_0 × Q8_0 with AVX2: as [`q8_0_512`] with `vpmaddubsw` + `vpmaddwd` for the byte products.
///
/// # Safety
/// AVX2, FMA and F16C; shapes as [`q8_0_512`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_256(row: &[u8], xq: &[i8], sx: &[f32], _: &[f32], _: &[f32]) -> f32 {
    let nb = sx.len();
    assert!(row.len() >= nb * 34 && xq.len() >= nb * 32);
    let (rp, xp) = (row.as_ptr(), xq.as_ptr());
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); 4];
    let block = |b: usize, acc: __m256| {
        let w = _mm256_loadu_si256(rp.add(34 * b + 2).cast());
        let xv = _mm256_loadu_si256(xp.add(32 * b).cast());
        let pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(xv, w));
        let dot = _mm256_madd_epi16(pairs, ones);
        let d = _mm256_set1_ps(f16_at(rp.add(34 * b)) * sx[b]);
        _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), d, acc)
    };
    let mut b = 0;
    while b + 4 <= nb {
        for (u, a) in acc.iter_mut().enumerate() {
            *a = block(b + u, *a);
        }
        b += 4;
    }
    while b < nb {
        acc[0] = block(b, acc[0]);
        b += 1;
    }
    hsum_256(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ))
}

/// Sum of the eight `i32` lanes.
#[inline(always)]
unsafe fn hsum_i32_256(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// The 32 nibbles of a Q4_0-style `qs` (16 bytes) in element order: low nibbles then high.
#[inline(always)]
unsafe fn nibbles_32(qs: *const u8) -> __m256i {
    let b = _mm_loadu_si128(qs.cast());
    let m4 = _mm_set1_epi8(0x0F);
    _mm256_set_m128i(
        _mm_and_si128(_mm_srli_epi16(b, 4), m4),
        _mm_and_si128(b, m4),
    )
}

/// Q5_0 × Q8_0. The fifth bits come from a mask register: where bit `j` of `qh` is clear, the
/// signed level `q − 16` is the nibble minus 16; then the sign trick.
///
/// # Safety
/// AVX-512 BW/VL/VNNI and F16C; `row` is `sx.len()` Q5_0 blocks and `xq` as many 32-level
/// blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q5_0_512(row: &[u8], xq: &[i8], sx: &[f32], _: &[f32], _: &[f32]) -> f32 {
    let nb = sx.len();
    assert!(row.len() >= nb * 22 && xq.len() >= nb * 32);
    let (rp, xp) = (row.as_ptr(), xq.as_ptr());
    let sixteen = _mm256_set1_epi8(16);
    let mut acc = [_mm256_setzero_ps(); 4];
    let block = |b: usize, acc: __m256| {
        let blk = rp.add(22 * b);
        let qh = blk.add(2).cast::<u32>().read_unaligned();
        let nib = nibbles_32(blk.add(6));
        let w = _mm256_mask_sub_epi8(nib, !qh, nib, sixteen);
        let xv = _mm256_loadu_si256(xp.add(32 * b).cast());
        let dot = _mm256_dpbusd_epi32(
            _mm256_setzero_si256(),
            _mm256_abs_epi8(w),
            _mm256_sign_epi8(xv, w),
        );
        let d = _mm256_set1_ps(f16_at(blk) * sx[b]);
        _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), d, acc)
    };
    let mut b = 0;
    while b + 4 <= nb {
        for (u, a) in acc.iter_mut().enumerate() {
            *a = block(b + u, *a);
        }
        b += 4;
    }
    while b < nb {
        acc[0] = block(b, acc[0]);
        b += 1;
    }
    hsum_256(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ))
}

/// Q5_0 × Q8_0 with AVX2: the fifth bits are spread to bytes by a shuffle (byte `j` gets `qh`
/// byte `j / 8`) and an OR with every bit but `j % 8` set, which is all ones exactly when bit
/// `j` is set; where it is clear, the nibble with its top four bits set is the signed `q − 16`.
///
/// # Safety
/// AVX2, FMA and F16C; shapes as [`q5_0_512`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_0_256(row: &[u8], xq: &[i8], sx: &[f32], _: &[f32], _: &[f32]) -> f32 {
    let nb = sx.len();
    assert!(row.len() >= nb * 22 && xq.len() >= nb * 32);
    let (rp, xp) = (row.as_ptr(), xq.as_ptr());
    let spread = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3,
        3, 3,
    );
    let others = _mm256_set1_epi64x(0x7FBF_DFEF_F7FB_FDFE);
    let high = _mm256_set1_epi8(0xF0u8 as i8);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); 4];
    let block = |b: usize, acc: __m256| {
        let blk = rp.add(22 * b);
        let qh = blk.add(2).cast::<i32>().read_unaligned();
        let bits = _mm256_or_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(qh), spread), others);
        let set = _mm256_cmpeq_epi8(bits, _mm256_set1_epi8(-1));
        let w = _mm256_or_si256(nibbles_32(blk.add(6)), _mm256_andnot_si256(set, high));
        let xv = _mm256_loadu_si256(xp.add(32 * b).cast());
        let pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(xv, w));
        let dot = _mm256_madd_epi16(pairs, ones);
        let d = _mm256_set1_ps(f16_at(blk) * sx[b]);
        _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), d, acc)
    };
    let mut b = 0;
    while b + 4 <= nb {
        for (u, a) in acc.iter_mut().enumerate() {
            *a = block(b + u, *a);
        }
        b += 4;
    }
    while b < nb {
        acc[0] = block(b, acc[0]);
        b += 1;
    }
    hsum_256(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ))
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

/// Q4_K × Q8_K: per 64 elements the low and high nibbles of 32 bytes are multiplied with
/// `vpmaddubsw` (at most 2·15·127, no saturation) and weighted by their 6-bit sub-scales with
/// `vpmaddwd`, summing in `i32` over the super-block; the mins go through the group sums.
///
/// # Safety
/// AVX2, FMA and F16C; `row` is `xq.len() / 256` Q4_K blocks; `sx`, `s` have 8 groups per block.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_256(row: &[u8], xq: &[i8], sx: &[f32], _: &[f32], s: &[f32]) -> f32 {
    let nb = xq.len() / 256;
    assert!(row.len() >= nb * 144 && sx.len() >= nb * 8 && s.len() >= nb * 8);
    let (rp, xp) = (row.as_ptr(), xq.as_ptr());
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = _mm256_setzero_ps();
    let mut acc_min = _mm256_setzero_ps();
    for b in 0..nb {
        let blk = rp.add(144 * b);
        let sc = k4_scales(&*blk.add(4).cast::<[u8; 12]>());
        let (d, dmin) = (f16_at(blk), f16_at(blk.add(2)));
        // Σ_j m_j·sx·Σx_j, scaled by dmin below.
        let mins = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(
            sc.as_ptr().add(8).cast(),
        )));
        acc_min = _mm256_fmadd_ps(
            _mm256_mul_ps(mins, _mm256_set1_ps(dmin)),
            _mm256_loadu_ps(s.as_ptr().add(8 * b)),
            acc_min,
        );
        let mut sumi = _mm256_setzero_si256();
        for c in 0..4 {
            let bits = _mm256_loadu_si256(blk.add(16 + 32 * c).cast());
            let lo = _mm256_and_si256(bits, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            let x0 = _mm256_loadu_si256(xp.add(256 * b + 64 * c).cast());
            let x1 = _mm256_loadu_si256(xp.add(256 * b + 64 * c + 32).cast());
            let p0 = _mm256_madd_epi16(
                _mm256_maddubs_epi16(lo, x0),
                _mm256_set1_epi16(i16::from(sc[2 * c])),
            );
            let p1 = _mm256_madd_epi16(
                _mm256_maddubs_epi16(hi, x1),
                _mm256_set1_epi16(i16::from(sc[2 * c + 1])),
            );
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(d * sx[8 * b]), acc);
    }
    hsum_256(_mm256_sub_ps(acc, acc_min))
}

/// Q6_K × Q8_K: per 128 elements, 64 bytes of low nibbles and 32 bytes of high bit pairs give
/// four 32-level vectors in `0..64`, multiplied with `vpmaddubsw` (at most 2·63·127) and weighted
/// by the signed 8-bit scales of their two 16-element groups with `vpmaddwd`. The offset 32 is
/// taken off in integers, `32·Σ_g sc_g·Σx_g`, which is exact.
///
/// # Safety
/// AVX2, FMA and F16C; `row` is `xq.len() / 256` Q6_K blocks; `sx`, `xsum` have 16 groups per
/// block.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_256(row: &[u8], xq: &[i8], sx: &[f32], xsum: &[f32], _: &[f32]) -> f32 {
    let nb = xq.len() / 256;
    assert!(row.len() >= nb * 210 && sx.len() >= nb * 16 && xsum.len() >= nb * 16);
    let (rp, xp) = (row.as_ptr(), xq.as_ptr());
    let m4 = _mm256_set1_epi8(0x0F);
    let m30 = _mm256_set1_epi8(0x30);
    let mut acc = 0.0f32;
    for b in 0..nb {
        let blk = rp.add(210 * b);
        let scales = &*blk.add(192).cast::<[i8; 16]>();
        let d = f16_at(blk.add(208));
        let mut sumi = _mm256_setzero_si256();
        for n in 0..2 {
            let ql = blk.add(64 * n);
            let qa = _mm256_loadu_si256(ql.cast());
            let qb = _mm256_loadu_si256(ql.add(32).cast());
            let qh = _mm256_loadu_si256(blk.add(128 + 32 * n).cast());
            let levels = [
                _mm256_or_si256(
                    _mm256_and_si256(qa, m4),
                    _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(qb, m4),
                    _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(qa, 4), m4),
                    _mm256_and_si256(qh, m30),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(qb, 4), m4),
                    _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30),
                ),
            ];
            for (sub, q) in levels.into_iter().enumerate() {
                let j = 8 * n + 2 * sub;
                let xv = _mm256_loadu_si256(xp.add(256 * b + 128 * n + 32 * sub).cast());
                let scale = _mm256_setr_m128i(
                    _mm_set1_epi16(i16::from(scales[j])),
                    _mm_set1_epi16(i16::from(scales[j + 1])),
                );
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(q, xv), scale);
                sumi = _mm256_add_epi32(sumi, p);
            }
        }
        let mut offset = 0i32;
        for (&sc, &xs) in scales.iter().zip(&xsum[16 * b..16 * b + 16]) {
            offset += i32::from(sc) * xs as i32;
        }
        let total = hsum_i32_256(sumi) - 32 * offset;
        acc += d * sx[16 * b] * total as f32;
    }
    acc
}
